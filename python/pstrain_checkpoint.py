"""Reads pstrain checkpoints and serving exports into NumPy arrays, and scores with them.

NumPy only (Debian's python3-numpy); run with /usr/bin/python3. The formats are specified in
docs/CHECKPOINT.md (checkpoints) and docs/SERVING.md (exports); this reader follows them:

    m = pstrain_checkpoint.load("model_dir")          # the checkpoint LATEST names
    m = pstrain_checkpoint.load("model_dir/ckpt-390")  # one checkpoint
    m = pstrain_checkpoint.load("export")             # the newest export version
    m = pstrain_checkpoint.load("export/390")         # one export version

    m.ids          int64 [N]        the stored (trained) rows' global ids, ascending
    m.rows         float32 [N, D]   their weights [w, v_0 .. v_{k-1}] (D = 1 + k; with tables, the
                                    stride 1 + the largest dim, zeros after a row's table's width)
    m.dense        float32 [dense_size]
    m.tensors      {"bias", "mlp0/w", "mlp0/b", ..., "out/w", "out/b"}: views of m.dense, shaped
                   (DCN_V2 / DLRM / BLOCKS add "cross<l>/..." or "bottom<l>/...": model.h; a list
                   field f pooled by target attention adds "att<f>/mlp<l>/w", ..., "att<f>/out/b")
    m.config       the model description (a dict: features, model, init_seed, ...); None for a
                   checkpoint written before checkpoints recorded it (MANIFEST version 1)
    m.fields       the feature layout: name, kind, offset, rows, seed, table, dim of each field
    m.tables       the tables (FeatureConfig.table): name, begin, end, dim, width; the default
                   table first (name "") when some field names none
    m.attention    DIN's attended list fields: [(field, target field, attention MLP widths)]
    m.row_state, m.dense_state   a checkpoint's optimizer slots (None for an export; row_state
                                 None when its tables' rows have slots of different sizes)

    m.lookup(ids)                  rows of any ids: stored ones, else their initial value
                                   (Model::InitRow; a named table's initializer)
    m.encode_criteo(lines)         raw Criteo TSV lines -> (ids [n, F], scales [n, F], labels)
    m.encode_values(rows)          rows of raw values (one per field) -> (ids, scales)
    m.predict(ids, scales)         probabilities of encoded examples (the model's forward pass)

List fields (docs/FORMATS.md "Lists") and fields sharing another's rows are read as
FeatureSpec encodes them: a list's value is its CSV text ("a|b:0.5|c", the field's separator) or
a list of keys / (key, weight) pairs, cut to max_length (REFUSE: ValueError), each id's scale its
weight times the combiner's normalization (MEAN, SUM, SQRTN); an empty list is the missing row.
With list fields, ids and scales are [n, F, L] (padded with scale 0) and each field's rows are
pooled before the interaction, as the C++ tower does; a list that names an attention_target (DIN,
docs/CONFIG.md "DIN") is pooled by the target attention MLP instead.

Tables (docs/CONFIG.md "Tables", docs/SERVING.md "Tables"): fields naming one table hash a key to
the same row (the table's seed); an export of format version 2 stores each table's rows at its
width 1 + dim, read here into the stride; a row never trained reads as its table's initializer.
A field of dim d_f contributes d_f floats to the MLP's input, and a field of a table with
fm_join EXCLUDE (its dim not k) stays out of the FM term.

Dynamic tables (docs/SERVING.md "Dynamic tables"): a field of dynamic table d encodes a key as
the negative id DynamicRow(d, hash_key(key, the table's seed)) and a missing value as
DynamicMissingRow(d) (common/dynamic_rows.h); an export of format version 3 holds each dynamic
table's live rows (m.dynamic: {d: (keys uint64 [n], rows float32 [n, 1 + dim])}); lookup reads a
key without a row as training does: the table's initializer with ALWAYS admission, zeros with
COUNT or PROBABILITY. A checkpoint's dynamic tables (docs/CHECKPOINT.md "Dynamic tables": a
`pstrain train` checkpoint's dynamic-<table> files, a PS checkpoint's DYNM groups of every shard
file, merged; a delta's chain applied link by link, its tombstones deleting keys) fill the same
m.dynamic, so lookup and predict read them, and m.dynamic_snapshots ({table name:
DynamicSnapshot}) with the optimizer slots, each row's count, last pass and step, the admission
sketch and the store's counters. A key is the key as the stores keep it: the low 55 bits of
hash_key(raw key, the table's seed), 0 -> 1 (dynamic_row(d, key) is its row id).
read_dynamic_file(path) reads one dynamic-<table> file as it is (a delta keeps its tombstones).

Every checksum is verified (CRC32C of every block, in pure Python: about 1 s per 5 MB; pass
verify=False to skip it for large files). Damaged or inconsistent files raise FormatError (a
ValueError) naming the file, the block and what was expected; a count in a header is checked
against the file's size before anything is built for it.
"""

import bisect
import math
import os
import struct

import numpy as np

__all__ = ["load", "FormatError", "Model"]


class FormatError(ValueError):
    """A file that is not what the format says, named with the place of the problem (a
    ValueError: hostile bytes are a bad value, never a crash or a huge allocation)."""


# ---------------------------------------------------------------------------------------------
# CRC32C (Castagnoli, reflected 0x82F63B78) and the block file
# ---------------------------------------------------------------------------------------------

def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_blocks(path, verify=True):
    """The blocks of a block file, [(tag, payload)], the end block checked and left out."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 16 or data[:8] != b"PSTRNCKP":
        raise FormatError("%s: not a pstrain block file (bad magic or shorter than 16 bytes)" % path)
    version, header_crc = struct.unpack_from("<II", data, 8)
    if verify and _masked(crc32c(data[:12])) != header_crc:
        raise FormatError("%s: header checksum mismatch" % path)
    if version != 1:
        raise FormatError("%s: block file version %d, this reader reads 1" % (path, version))
    blocks, off, index = [], 16, 0
    while True:
        if off + 16 > len(data):
            raise FormatError("%s: block %d at offset %d: truncated header" % (path, index, off))
        tag = data[off:off + 4].decode("latin-1")
        flags, length = struct.unpack_from("<IQ", data, off + 4)
        end = off + 16 + length
        if end + 4 > len(data):
            raise FormatError("%s: block %d ('%s') at offset %d: truncated" % (path, index, tag, off))
        if verify:
            (crc,) = struct.unpack_from("<I", data, end)
            if _masked(crc32c(data[off:end])) != crc:
                raise FormatError("%s: block %d ('%s') at offset %d: checksum mismatch"
                                  % (path, index, tag, off))
        if flags != 0:
            raise FormatError("%s: block %d ('%s'): unknown flags %d" % (path, index, tag, flags))
        payload = data[off + 16:end]
        off = end + 4
        if tag == "ENDB":
            if len(payload) != 8:
                raise FormatError("%s: end block at offset %d: a payload of %d bytes, expected 8"
                                  % (path, off - length - 20, len(payload)))
            (count,) = struct.unpack("<Q", payload)
            if count != index or off != len(data):
                raise FormatError("%s: end block at offset %d: %d blocks counted, %d said, %d bytes "
                                  "after it" % (path, off, index, count, len(data) - off))
            return blocks
        blocks.append((tag, payload))
        index += 1


# ---------------------------------------------------------------------------------------------
# Protocol buffers: the wire format, and the few messages the files hold
# ---------------------------------------------------------------------------------------------

def _varint(buf, pos):
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise FormatError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            raise FormatError("varint too long")


def _signed(v, bits=64):
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


# field number -> (name, kind, repeated); kind: "int" (signed varint), "uint", "bool", "float",
# "double", "string", or a nested schema (dict). Enums are ints.
_OPTIMIZER = {1: ("type", "int", False), 2: ("learning_rate", "float", False),
              3: ("initial_accumulator", "float", False), 4: ("beta1", "float", False),
              5: ("beta2", "float", False), 6: ("epsilon", "float", False),
              7: ("l1", "float", False), 8: ("l2", "float", False),
              9: ("lr_power", "float", False)}
# ListSpec is read strictly (key 0): a field this reader does not know (a newer pooling) is
# recorded under "_unknown" and refused, never ignored.
_LIST = {0: "strict", 1: ("combiner", "int", False), 2: ("max_length", "int", False),
         3: ("overflow", "int", False), 4: ("separator", "string", False),
         5: ("weights_key", "string", False), 6: ("attention_target", "string", False),
         7: ("attention_hidden", "int", True)}
_FIELD = {1: ("name", "string", False), 2: ("kind", "int", False),
          3: ("numeric_mode", "int", False), 4: ("vocab_size", "uint", False),
          5: ("numeric_transform", "int", False), 6: ("list", _LIST, False),
          7: ("share_rows_with", "string", False), 8: ("table", "string", False)}
# TableConfig (docs/CONFIG.md "Tables"); its optimizer overrides do not matter to a reader.
_TABLE_INIT = {1: ("type", "int", False), 2: ("stddev", "float", False),
               3: ("limit", "float", False)}
# DynamicTableConfig: only the admission matters to a reader (what a key without a row reads).
_DYNAMIC = {1: ("admission", "int", False)}
_TABLE = {1: ("name", "string", False), 2: ("dim", "int", False), 3: ("rows", "uint", False),
          4: ("initializer", _TABLE_INIT, False), 6: ("partitions", "int", False),
          7: ("fm_join", "int", False), 8: ("dynamic", _DYNAMIC, False)}
_FEATURES = {1: ("preset", "int", False), 2: ("field", _FIELD, True),
             3: ("categorical_vocab_size", "uint", False), 4: ("numeric_vocab_size", "uint", False),
             5: ("numeric_mode", "int", False), 6: ("label_name", "string", False),
             7: ("hash_seed", "uint", False), 8: ("numeric_transform", "int", False),
             9: ("table", _TABLE, True)}
_BLOCKS = {1: ("interaction", "int", False), 2: ("cross_layers", "int", False),
           3: ("cross_rank", "int", False), 4: ("join", "int", False), 5: ("mlp", "bool", False),
           6: ("bottom_hidden", "int", True), 7: ("cross_experts", "int", False)}
_MODEL_CONFIG = {1: ("type", "int", False), 2: ("embedding_dim", "int", False),
                 3: ("hidden", "int", True), 4: ("precision", "int", False),
                 5: ("embedding_init_stddev", "float", False), 6: ("embedding_l2", "float", False),
                 7: ("blocks", _BLOCKS, False)}
_DESCRIPTION = {1: ("features", _FEATURES, False), 2: ("model", _MODEL_CONFIG, False),
                3: ("init_seed", "uint", False), 4: ("init_rule", "int", False),
                5: ("sparse_optimizer", _OPTIMIZER, False),
                6: ("dense_optimizer", _OPTIMIZER, False)}
_MANIFEST = {1: ("step", "int", False), 2: ("num_shards", "int", False),
             3: ("num_workers", "int", False), 4: ("table_rows", "int", False),
             5: ("partitions", "int", False), 6: ("row_dim", "int", False),
             7: ("dense_size", "int", False),
             8: ("file", {1: ("name", "string", False), 2: ("bytes", "uint", False)}, True),
             9: ("created_by", "string", False), 10: ("wall_time", "double", False),
             11: ("version", "int", False), 12: ("model", _DESCRIPTION, False),
             13: ("delta", {1: ("base_step", "int", False), 2: ("parent_step", "int", False),
                            3: ("depth", "int", False)}, False)}
_EXPORT_HEADER = {1: ("format_version", "int", False), 2: ("model", _DESCRIPTION, False),
                  3: ("row_encoding", "int", False), 4: ("table_rows", "int", False),
                  5: ("row_dim", "int", False), 6: ("rows", "int", False),
                  7: ("dense_size", "int", False),
                  8: ("dense_tensor", {1: ("name", "string", False), 2: ("offset", "int", False),
                                       3: ("shape", "int", True)}, True),
                  9: ("source_checkpoint", "string", False), 10: ("step", "int", False),
                  11: ("version", "int", False), 12: ("created_by", "string", False),
                  13: ("wall_time", "double", False), 14: ("dynamic_rows", "int", False)}

# proto2 defaults of the fields a reader needs (proto/pstrain/config.proto)
_DEFAULTS = {
    "features": {"preset": 1, "categorical_vocab_size": 1000000, "numeric_vocab_size": 1024,
                 "numeric_mode": 0, "label_name": "label", "hash_seed": 0x5EED,
                 "numeric_transform": 0, "field": []},
    "field": {"kind": 0, "numeric_mode": 0, "numeric_transform": 0},
    "list": {"combiner": 0, "max_length": 64, "overflow": 0, "separator": "|"},
    "table": {"dim": 0, "rows": 0, "fm_join": 0},
    "initializer": {"type": 0},
    "model": {"type": 0, "embedding_dim": 16, "hidden": [], "precision": 0,
              "embedding_init_stddev": 0.01, "embedding_l2": 0.0},
    "blocks": {"interaction": 0, "cross_layers": 0, "cross_rank": 0, "join": 0, "mlp": False,
               "bottom_hidden": [], "cross_experts": 0},
}


def parse_message(buf, schema):
    """A dict of the message's known fields (unknown ones are skipped, as protobuf does)."""
    out, pos = {}, 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        else:
            raise FormatError("unsupported wire type %d of field %d" % (wire, number))
        if pos > len(buf):
            raise FormatError("truncated field %d" % number)
        if number not in schema or number == 0:
            if schema.get(0) == "strict":
                out.setdefault("_unknown", []).append(number)
            continue
        name, kind, repeated = schema[number]
        if isinstance(kind, dict):
            values = [parse_message(value, kind)]
        elif kind in ("int", "uint", "bool") and wire == 2:  # packed
            values, p = [], 0
            while p < len(value):
                v, p = _varint(value, p)
                values.append(v)
        elif kind in ("int", "uint", "bool"):
            values = [value]
        elif kind == "float":
            values = [struct.unpack("<f", value)[0]]
        elif kind == "double":
            values = [struct.unpack("<d", value)[0]]
        else:
            values = [value.decode("utf-8")]
        if kind == "int":
            values = [_signed(v) for v in values]
        elif kind == "bool":
            values = [bool(v) for v in values]
        if repeated:
            out.setdefault(name, []).extend(values)
        else:
            out[name] = values[-1]
    return out


# ---------------------------------------------------------------------------------------------
# The model's rules: feature hashing, the initial rows, the forward pass
# ---------------------------------------------------------------------------------------------

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
CATEGORICAL, NUMERIC = 0, 1
BUCKET, DENSE = 0, 1
LOG1P, NO_TRANSFORM = 0, 1
DEEPFM, LR, FM, WIDE_DEEP, DCN_V2, DLRM, BLOCKS, DIN = 0, 1, 2, 3, 4, 5, 6, 7
# ModelBlocks (proto/pstrain/config.proto): the interaction and the join.
NO_INTERACTION, FM_TERM, CROSS_V2, DOT = 0, 1, 2, 3
STACKED, PARALLEL = 0, 1
# ListSpec (docs/FORMATS.md "Lists"): the combiners and what an over-long list does.
MEAN, SUM, SQRTN = 0, 1, 2
# TableInitializer.Type and TableConfig.FmJoin.
NORMAL, TRUNCATED_NORMAL, UNIFORM, ZEROS = 0, 1, 2, 3
FM_REFUSE, FM_EXCLUDE = 0, 1
_HEX = frozenset("0123456789abcdefABCDEF")
TRUNCATE, REFUSE = 0, 1


def fmix64(k):
    """murmur3's finalizer (common/hash.h Fmix64), on Python ints."""
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M64
    k ^= k >> 33
    return k


def hash_key(key, field_seed):
    """common/hash.h HashKey."""
    return fmix64((key & _M64) ^ fmix64((field_seed + _GOLDEN) & _M64))


def hash_bytes(data):
    """FNV-1a 64 (common/hash.h HashBytes): the key of a non-hex text value (CSV)."""
    h = 0xCBF29CE484222325
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & _M64
    return h


def _splitmix64(x):
    x = (x + _GOLDEN) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class _Rng:
    """xoshiro256** seeded as common/random.h's Rng."""

    def __init__(self, seed):
        self.s, x = [], seed
        for _ in range(4):
            x = (x + _GOLDEN) & _M64
            self.s.append(_splitmix64(x))

    def next(self):
        s = self.s
        r = (((s[1] * 5) & _M64) << 7 | ((s[1] * 5) & _M64) >> 57) & _M64
        result = (r * 9) & _M64
        t = (s[1] << 17) & _M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = ((s[3] << 45) | (s[3] >> 19)) & _M64
        return result

    def uniform_double(self):
        return (self.next() >> 11) * 2.0 ** -53

    def normal(self):
        u1 = self.uniform_double()
        u2 = self.uniform_double()
        if u1 < 1e-300:
            u1 = 1e-300
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)


def log_squared_bucket(x):
    """The FuxiCTR / Kaggle winners' bucket (FeatureSpec::LogSquaredBucket)."""
    if x > 2:
        l = math.log(x)
        return int(math.floor(l * l))
    return int(x)  # truncation toward zero, as C++'s cast


def _reduce(h, n):
    return (h * n) >> 64


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

_DYNAMIC_KEY_BITS = 55
_DYNAMIC_KEY_MASK = (1 << _DYNAMIC_KEY_BITS) - 1


def dynamic_row(table, key):
    """common/dynamic_rows.h DynamicRow: the negative int64 id of `key` in dynamic table `table`
    (the key's low 55 bits; 0 -> 1, the key 0 being the missing row's)."""
    k = int(key) & _DYNAMIC_KEY_MASK
    if k == 0:
        k = 1
    return ((1 << 63) | (int(table) << _DYNAMIC_KEY_BITS) | k) - (1 << 64)


def dynamic_missing_row(table):
    """DynamicMissingRow: the row of dynamic table `table` that stands for a missing value."""
    return ((1 << 63) | (int(table) << _DYNAMIC_KEY_BITS)) - (1 << 64)


class Model:
    """A checkpoint's or an export's parameters (see the module's docstring)."""

    def __init__(self, path, config, ids, rows, dense, row_dim, table_rows, tensors=None,
                 row_state=None, dense_state=None, step=None, version=None):
        self.path, self.config = path, config
        self.ids, self.rows, self.dense = ids, rows, dense
        self.row_dim, self.table_rows = row_dim, table_rows
        self.row_state, self.dense_state = row_state, dense_state
        self.step, self.version = step, version
        self.fields, self.tensors, self.blocks, self.dense_fields = [], {}, None, []
        # Without a description: one default table of rows of row_dim floats.
        self.k, self.tables = row_dim - 1, []
        self.attention = []
        # Dynamic tables: their specs by dynamic index, and the live rows an export holds.
        self.dynamic_tables, self.dynamic = [], {}
        # A checkpoint's dynamic tables by name, with their slots and metadata (DynamicSnapshot).
        self.dynamic_snapshots = {}
        if config is not None:
            self._layout(tensors)

    # -- the description ----------------------------------------------------------------------
    def _layout(self, tensors):
        features = dict(_DEFAULTS["features"], **self.config.get("features", {}))
        model = dict(_DEFAULTS["model"], **self.config.get("model", {}))
        self.config["features"], self.config["model"] = features, model
        if features.get("preset", 1) != 0:
            raise FormatError("%s: the model description's features are not resolved (preset set)"
                              % self.path)
        offset, seed0 = 0, features["hash_seed"]
        self.model_type = model["type"]
        self.k = 0 if self.model_type == LR else model["embedding_dim"]
        specs = [dict(_DEFAULTS["field"], **f) for f in features["field"]]
        names = [f["name"] for f in specs]
        named = self._named_tables(features, model)
        for i, f in enumerate(specs):
            dense = f["kind"] == NUMERIC and f["numeric_mode"] == DENSE
            if "table" in f and f["table"] not in named:
                raise FormatError("%s: field '%s' names table '%s', which is not a features.table "
                                  "entry" % (self.path, f["name"], f["table"]))
            rows = named[f["table"]]["rows"] if "table" in f else 2 if dense else f["vocab_size"]
            field = {"name": f["name"], "kind": f["kind"], "numeric_mode": f["numeric_mode"],
                     "numeric_transform": f["numeric_transform"], "rows": rows,
                     "offset": offset, "seed": (seed0 * 1000003 + i) & _M64, "list": None,
                     "shares_rows_of": None}
            if "list" in f:
                spec = dict(_DEFAULTS["list"], **f["list"])
                if "_unknown" in spec:
                    raise FormatError("%s: field '%s' list sets ListSpec field(s) %s, which this "
                                      "reader does not know (a newer pstrain's pooling)"
                                      % (self.path, f["name"], spec["_unknown"]))
                if spec["combiner"] not in (MEAN, SUM, SQRTN) or \
                        spec["overflow"] not in (TRUNCATE, REFUSE) or spec["max_length"] < 1:
                    raise FormatError("%s: field '%s' list %s: expected combiner 0..2, overflow "
                                      "0..1, max_length >= 1" % (self.path, f["name"], spec))
                field["list"] = spec
            if "share_rows_with" in f:
                # FeatureSpec::Create: the target's slice (offset, rows, hash seed) and no rows
                # of its own; the target may come later.
                t = names.index(f["share_rows_with"]) if f["share_rows_with"] in names else -1
                if t < 0 or t == i or "share_rows_with" in specs[t]:
                    raise FormatError("%s: field '%s' shares the rows of '%s', which is not a "
                                      "field of its own rows" % (self.path, f["name"],
                                                                 f["share_rows_with"]))
                field["shares_rows_of"] = t
            elif "table" not in f:
                offset += rows
            field["table"] = f.get("table")
            self.fields.append(field)
        for field in self.fields:
            if field["shares_rows_of"] is not None:
                target = self.fields[field["shares_rows_of"]]
                field.update(offset=target["offset"], rows=target["rows"], seed=target["seed"],
                             table=target["table"])
        # The tables (FeatureSpec::Create): the default one (the fields' own slices, dim k) when
        # some field names no table, or when none is named; then the named ones, in config order,
        # each a contiguous range whose row 0 is the missing row of its fields.
        self.tables = []
        if not named or any(f["table"] is None for f in self.fields):
            self.tables.append({"name": "", "begin": 0, "end": offset, "dim": self.k,
                                "default": True, "fm_join": FM_REFUSE})
        for t in named.values():
            t.update(begin=offset, end=offset + t["rows"], default=False)
            offset += t["rows"]
            if t["dynamic"] is None:
                self.tables.append(t)
        self._table_begins = [t["begin"] for t in self.tables]
        for field in self.fields:
            t = named.get(field["table"]) if field["table"] is not None else self.tables[0]
            if field["table"] is not None:
                field.update(offset=t["begin"], rows=t["rows"], seed=t["seed"])
            field["dynamic"] = t.get("dynamic_index") if t.get("dynamic") is not None else None
            field["dim"] = t["dim"]
            field["fm_excluded"] = t["fm_join"] == FM_EXCLUDE and t["dim"] != self.k
        # DIN's target attention (list.attention_target, FeatureSpec::Create's rules): the target
        # is another single-valued CATEGORICAL field; the attention MLP's widths default to [36].
        self.attention = []  # [(f, t, hidden)], in field order (the dense layout's order)
        for i, field in enumerate(self.fields):
            spec = field["list"]
            if spec is None or "attention_target" not in spec:
                continue
            target = spec["attention_target"]
            t = names.index(target) if target in names else -1
            if t < 0 or t == i or self.fields[t]["list"] is not None or \
                    self.fields[t]["kind"] != CATEGORICAL:
                raise FormatError("%s: field '%s' list.attention_target '%s': expected another "
                                  "single-valued CATEGORICAL field" % (self.path, field["name"],
                                                                      target))
            hidden = list(spec.get("attention_hidden", [])) or [36]
            if any(w < 1 for w in hidden):
                raise FormatError("%s: field '%s' list.attention_hidden %s: expected widths >= 1"
                                  % (self.path, field["name"], hidden))
            self.attention.append((i, t, hidden))
        if offset != self.table_rows:
            raise FormatError("%s: the description's fields make %d rows, the file has %d"
                              % (self.path, offset, self.table_rows))
        # The stride of a row: 1 + the largest dim (Model::row_dim()); a table's rows use their
        # first 1 + dim floats, zeros after them.
        stride = 1 + max([self.k] + [t["dim"] for t in self.tables + self.dynamic_tables])
        if self.row_dim != stride:
            raise FormatError("%s: rows of %d floats, the description makes %d"
                              % (self.path, self.row_dim, stride))
        for t in self.tables + self.dynamic_tables:
            t["width"] = 1 + t["dim"]
        if self.model_type not in (DEEPFM, LR, FM, WIDE_DEEP, DCN_V2, DLRM, BLOCKS, DIN):
            raise FormatError("%s: model type %d, this reader knows 0..7"
                              % (self.path, self.model_type))
        grammar = self.model_type in (DCN_V2, DLRM, BLOCKS, DIN)
        if self.attention and not grammar:
            raise FormatError("%s: list.attention_target with model type %d; expected DIN, DCN_V2, "
                              "DLRM or BLOCKS" % (self.path, self.model_type))
        # The block grammar: a checkpoint records the resolved blocks (ResolveModelConfig).
        self.blocks = dict(_DEFAULTS["blocks"], **model.get("blocks", {})) if grammar else None
        deep = self.model_type in (DEEPFM, WIDE_DEEP) or (grammar and self.blocks["mlp"])
        hidden = list(model["hidden"]) if deep else []
        if self.model_type in (DEEPFM, WIDE_DEEP) and not hidden:
            hidden = [400, 400, 400]
        self.dense_fields = [i for i, f in enumerate(self.fields)
                             if f["kind"] == NUMERIC and f["numeric_mode"] == DENSE]
        # The dense layout (Model::dense_layout), unless the export lists it.
        if tensors is None:
            tensors, off, width = [("bias", 0, (1,))], 1, sum(f["dim"] for f in self.fields)

            def add(name, shape):
                nonlocal off
                tensors.append((name, off, shape))
                off += int(np.prod(shape))

            # The attention MLPs follow "bias" (CtrModel::MakeBlocks).
            for f, _t, att_hidden in self.attention:
                w_in = 4 * self.fields[f]["dim"]  # [e, c, e - c, e * c] at the field's dim
                for l, out in enumerate(att_hidden):
                    add("att%d/mlp%d/w" % (f, l), (w_in, out))
                    add("att%d/mlp%d/b" % (f, l), (out,))
                    w_in = out
                add("att%d/out/w" % f, (w_in, 1))
                add("att%d/out/b" % f, (1,))
            interaction = self.blocks["interaction"] if grammar else NO_INTERACTION
            if interaction == CROSS_V2:
                D, r = width, self.blocks["cross_rank"]
                K = self.blocks["cross_experts"]
                for l in range(self.blocks["cross_layers"]):
                    if K >= 2:  # DCN-Mix: V_i, then C_i, then U_i, then the gate
                        for kind, shape in (("v", (D, r)), ("c", (r, r)), ("u", (r, D))):
                            for i in range(K):
                                add("cross%d/%s%d" % (l, kind, i), shape)
                        add("cross%d/gate" % l, (D, K))
                    elif r == 0:
                        add("cross%d/w" % l, (D, D))
                    else:
                        add("cross%d/v" % l, (D, r))
                        add("cross%d/u" % l, (r, D))
                    add("cross%d/b" % l, (D,))
                if not deep or self.blocks["join"] == PARALLEL:
                    add("cross_out/w", (D, 1))
                if not deep:
                    add("cross_out/b", (1,))
            elif interaction == DOT:
                m = len(self.fields)
                if self.dense_fields:
                    w_in = len(self.dense_fields)
                    for l, out in enumerate(list(self.blocks["bottom_hidden"]) + [self.k]):
                        add("bottom%d/w" % l, (w_in, out))
                        add("bottom%d/b" % l, (out,))
                        w_in = out
                    m += 1
                width = (self.k if self.dense_fields else 0) + m * (m - 1) // 2
            if hidden:
                for l, out in enumerate(hidden):
                    add("mlp%d/w" % l, (width, out))
                    add("mlp%d/b" % l, (out,))
                    width = out
                add("out/w", (width, 1))
                add("out/b", (1,))
        for name, off, shape in tensors:
            size = int(np.prod(shape))
            if off + size > len(self.dense):
                raise FormatError("%s: tensor %s [%d, +%d) is past the dense vector of %d floats"
                                  % (self.path, name, off, size, len(self.dense)))
            self.tensors[name] = self.dense[off:off + size].reshape(shape)
        self.hidden = hidden

    def _named_tables(self, features, model):
        """The description's tables (FeatureConfig.table), resolved as FeatureSpec::Create does:
        {name: {name, dim, rows, seed, initializer, fm_join}}, in config order."""
        named = {}
        k = self.k
        for i, t in enumerate(features.get("table", [])):
            t = dict(_DEFAULTS["table"], **t)
            init = dict(_DEFAULTS["initializer"], **t.get("initializer", {}))
            name = t.get("name", "")
            if name in named or not name:
                raise FormatError("%s: features.table[%d]: name %r is empty or not unique"
                                  % (self.path, i, name))
            dim = t["dim"] if t["dim"] > 0 else k
            dynamic = "dynamic" in t
            if not 0 < dim <= 1024 or (t["rows"] < 2 and not dynamic) or \
                    init["type"] not in (0, 1, 2, 3):
                raise FormatError("%s: features.table[%d] ('%s'): dim %d, rows %d, initializer %d: "
                                  "expected dim 1..1024, rows >= 2, initializer 0..3"
                                  % (self.path, i, name, dim, t["rows"], init["type"]))
            # float32 values, as the C++ reads them (a float widened to double).
            stddev = np.float32(init.get("stddev", model["embedding_init_stddev"]))
            limit = np.float32(init.get("limit", np.float32(math.sqrt(3.0)) * stddev))
            named[name] = {"name": name, "dim": dim, "rows": t["rows"],
                           "seed": hash_key(hash_bytes(name.encode()),
                                            (features["hash_seed"] ^ 0x7461626C65) & _M64),
                           "init_type": init["type"], "stddev": float(stddev),
                           "limit": float(limit), "fm_join": t["fm_join"],
                           "dynamic": t["dynamic"].get("admission", 0) if dynamic else None}
            if dynamic:  # no rows: its keys are hashed into ids of their own (dynamic_row)
                named[name].update(rows=0, dynamic_index=len(self.dynamic_tables))
                self.dynamic_tables.append(named[name])
        return named

    # -- rows -----------------------------------------------------------------------------------
    def row_table(self, row_id):
        """The table (a dict of self.tables: name, begin, end, dim, width) holding row_id."""
        return self.tables[bisect.bisect_right(self._table_begins, int(row_id)) - 1]

    def init_row(self, row_id):
        """A row's initial value, over the stride (zeros after its table's 1 + dim floats): the
        default table's Model::InitRow(row_id, init_seed) (w = 0, v_j = stddev * Normal from the
        row's stream); a named table's InitTableRow (ps/store/table_rows.h): w = 0, v_j from its
        initializer, drawn from the same stream."""
        seed = self.config.get("init_seed", 0)
        rng = _Rng(hash_key(int(row_id), seed))
        out = np.zeros(self.row_dim, dtype=np.float32)
        t = self.row_table(row_id) if self.tables else None
        if t is None or t["default"]:
            stddev = float(np.float32(self.config["model"]["embedding_init_stddev"]))
            for j in range(self.k):
                out[1 + j] = np.float32(stddev * rng.normal())
            return out
        return self._init_table_row(t, row_id)

    def _init_table_row(self, t, row_id):
        """InitTableRow (ps/store/table_rows.h) of named table t for row `row_id` (a dynamic
        row's negative id as its 64 bits), over the stride."""
        seed = self.config.get("init_seed", 0)
        rng = _Rng(hash_key(int(row_id) & _M64, seed))
        out = np.zeros(self.row_dim, dtype=np.float32)
        for j in range(t["dim"]):
            if t["init_type"] == NORMAL:
                x = t["stddev"] * rng.normal()
            elif t["init_type"] == TRUNCATED_NORMAL:
                z = rng.normal()
                while abs(z) > 2.0:  # TF's truncated_normal: drawn again beyond 2 stddev
                    z = rng.normal()
                x = t["stddev"] * z
            elif t["init_type"] == UNIFORM:
                x = t["limit"] * (2.0 * rng.uniform_double() - 1.0)
            else:
                x = 0.0
            out[1 + j] = np.float32(x)
        return out

    def _lookup_dynamic(self, row_id):
        """A dynamic table's row (row_id < 0), over the stride: the stored row, else what
        training reads for a key without a row (ALWAYS: the table's initializer, InitTableRow of
        the row's id; COUNT, PROBABILITY: zeros)."""
        table = (row_id & _M64) >> _DYNAMIC_KEY_BITS & 0xFF
        key = row_id & _DYNAMIC_KEY_MASK
        if table >= len(self.dynamic_tables):
            raise ValueError("row id %d is of dynamic table %d, the model has %d"
                             % (row_id, table, len(self.dynamic_tables)))
        t = self.dynamic_tables[table]
        out = np.zeros(self.row_dim, dtype=np.float32)
        keys, rows = self.dynamic.get(table, (np.zeros(0, np.uint64), None))
        pos = int(np.searchsorted(keys, np.uint64(key)))
        if pos < len(keys) and int(keys[pos]) == key:
            out[:t["width"]] = rows[pos]
        elif t["dynamic"] == 0:  # ALWAYS
            out[:] = self._init_table_row(t, row_id)
        return out

    def lookup(self, ids):
        """The rows of `ids` (any shape): stored values, else the initial value."""
        flat = np.asarray(ids, dtype=np.int64).ravel()
        if flat.size and flat.min() < 0:  # dynamic tables' ids
            out = np.empty((flat.size, self.row_dim), dtype=np.float32)
            neg = flat < 0
            if (~neg).any():
                out[~neg] = self.lookup(flat[~neg])
            cache = {}
            for i in np.nonzero(neg)[0]:
                r = int(flat[i])
                if r not in cache:
                    cache[r] = self._lookup_dynamic(r)
                out[i] = cache[r]
            return out.reshape(np.shape(ids) + (self.row_dim,))
        if flat.size and flat.max() >= self.table_rows:
            raise ValueError("row ids must be in [0, %d)" % self.table_rows)
        pos = np.searchsorted(self.ids, flat)
        pos_c = np.minimum(pos, max(len(self.ids) - 1, 0))
        found = (pos < len(self.ids)) & (self.ids[pos_c] == flat) if len(self.ids) else \
            np.zeros(flat.shape, bool)
        out = np.empty((flat.size, self.row_dim), dtype=np.float32)
        out[found] = self.rows[pos_c[found]]
        cache = {}
        for i in np.nonzero(~found)[0]:
            r = int(flat[i])
            if r not in cache:
                cache[r] = self.init_row(r)
            out[i] = cache[r]
        return out.reshape(np.shape(ids) + (self.row_dim,))

    # -- encoding raw rows ------------------------------------------------------------------------
    def _categorical_key(self, v):
        """A categorical value's raw key: an int, or text (1..16 hex digits, else hashed)."""
        if isinstance(v, str):
            try:
                key = int(v, 16) if 1 <= len(v) <= 16 and all(c in _HEX for c in v) else None
            except ValueError:
                key = None
            return key if key is not None else hash_bytes(v.encode())
        return int(v)

    def _row_of_key(self, field, key):
        if field.get("dynamic") is not None:
            return dynamic_row(field["dynamic"], hash_key(key, field["seed"]))
        return field["offset"] + 1 + _reduce(hash_key(key, field["seed"]), field["rows"] - 1)

    @staticmethod
    def _missing_row(field):
        """The row of a missing value: the field's slice's row 0, or its dynamic table's."""
        if field.get("dynamic") is not None:
            return dynamic_missing_row(field["dynamic"])
        return field["offset"]

    def _list_entries(self, r, field, v):
        """A list field's value -> its entries [(row id, scale)] (FeatureSpec::EncodeList):
        the first max_length ids (an over-long list under REFUSE is a ValueError naming the row
        and field), each scale the id's weight times the combiner's normalization; an empty list,
        or one whose MEAN / SQRTN denominator is 0, is the missing row."""
        spec = field["list"]
        if isinstance(v, str):  # the CSV syntax: "a|b:0.5|c"
            items = []
            for j, item in enumerate(v.split(spec["separator"]) if v else []):
                key, colon, w = item.rpartition(":")
                try:
                    weight = float(w) if colon else 1.0
                except ValueError:
                    weight = math.nan
                if not item or (colon and not key) or not math.isfinite(weight):
                    raise ValueError("row %d, field '%s': bad list item %d %r: expected id or "
                                     "id:weight" % (r, field["name"], j + 1, item))
                items.append((key, weight) if colon else (item, 1.0))
        else:  # keys, or (key, weight) pairs
            items = [x if isinstance(x, tuple) else (x, 1.0) for x in v]
        if len(items) > spec["max_length"]:
            if spec["overflow"] == REFUSE:
                raise ValueError("row %d, field '%s': list of %d ids, more than its "
                                 "list.max_length %d (list.overflow: REFUSE)"
                                 % (r, field["name"], len(items), spec["max_length"]))
            items = items[:spec["max_length"]]
        norm = 1.0
        if spec["combiner"] != SUM:
            d = sum(w if spec["combiner"] == MEAN else w * w for _, w in items)
            d = math.sqrt(d) if spec["combiner"] == SQRTN else d
            norm = 1.0 / d if d != 0.0 and math.isfinite(d) else 0.0
        if not items or norm == 0.0:
            return [(self._missing_row(field), 1.0)]
        return [(self._row_of_key(field, self._categorical_key(k)), float(np.float32(w * norm)))
                for k, w in items]

    def encode_values(self, rows):
        """Encodes rows of raw values, one list of F values per row (None = missing; numbers for
        numeric fields, int keys or text for categorical ones; for a list field, its text in the
        CSV syntax "a|b:0.5|c" or a list of keys or (key, weight) pairs) -> (ids, scales), each
        [n, F], or [n, F, L] padded with scale 0 when the model has list fields (L: the longest
        list's length)."""
        n, nf = len(rows), len(self.fields)
        entries = [[None] * nf for _ in range(n)]
        width = 1
        for r, values in enumerate(rows):
            if len(values) != nf:
                raise ValueError("row %d: %d values, the model has %d fields" % (r, len(values), nf))
            for f, (field, v) in enumerate(zip(self.fields, values)):
                if field["list"] is not None and v is not None:
                    entries[r][f] = self._list_entries(r, field, v)
                    width = max(width, len(entries[r][f]))
                elif v is None or v == "":
                    entries[r][f] = [(self._missing_row(field), 1.0)]
                elif field["kind"] == CATEGORICAL:
                    entries[r][f] = [(self._row_of_key(field, self._categorical_key(v)), 1.0)]
                elif field["numeric_mode"] == DENSE:
                    x = float(v)
                    entries[r][f] = [(field["offset"] + 1,
                                      math.log1p(max(x, 0.0))
                                      if field["numeric_transform"] == LOG1P else x)]
                else:
                    b = log_squared_bucket(float(v)) & _M64
                    entries[r][f] = [(self._row_of_key(field, b), 1.0)]
        lists = any(f["list"] is not None for f in self.fields)
        ids = np.zeros((n, nf, width), dtype=np.int64)
        scales = np.zeros((n, nf, width), dtype=np.float32)
        for r in range(n):
            for f in range(nf):
                ids[r, f, :] = self._missing_row(self.fields[f])  # padding: a valid row, scale 0
                for j, (row, scale) in enumerate(entries[r][f]):
                    ids[r, f, j], scales[r, f, j] = row, scale
        return (ids, scales) if lists else (ids[:, :, 0], scales[:, :, 0])

    def encode_criteo(self, lines, has_label=True):
        """Raw Criteo TSV lines (label, then the F values; or the F values only; a list field's
        value in the CSV syntax) -> (ids, scales, labels [n] or None), as encode_values."""
        rows, labels = [], []
        for line in lines:
            cols = line.rstrip("\r\n").split("\t")
            if has_label:
                labels.append(float(cols[0]))
                cols = cols[1:]
            cols += [""] * (len(self.fields) - len(cols))
            rows.append([c if f["list"] is not None else None if c == "" else
                         (c if f["kind"] == CATEGORICAL else float(c))
                         for f, c in zip(self.fields, cols)])
        ids, scales = self.encode_values(rows)
        return ids, scales, (np.array(labels, dtype=np.float32) if has_label else None)

    # -- the forward pass -------------------------------------------------------------------------
    def logits(self, ids, scales):
        """Model outputs of encoded examples (float64):
        bias + sum_f s_f w_f + FM term + MLP(concat_f s_f v_f) (worker/model/model.h), or the
        block grammar's cross network / dot interaction (DCN_V2, DLRM, BLOCKS), with DIN's
        attended list fields pooled by their attention MLP first."""
        ids = np.asarray(ids, dtype=np.int64)
        s = np.asarray(scales, dtype=np.float64)[..., None]
        raw = self.lookup(ids).astype(np.float64)
        rows = raw * s  # [n, F, D] (or [n, F, L, D]), scaled
        if rows.ndim == 4:  # list fields: each (example, field) pools its entries
            rows = rows.sum(axis=2)
            scales = np.asarray(scales)[:, :, 0]  # DENSE numeric fields' values (never lists)
        w, v = rows[..., 0], rows[..., 1:]
        z = float(self.tensors["bias"][0]) + w.sum(axis=1)
        t = {name: a.astype(np.float64) for name, a in self.tensors.items()}
        if self.attention:
            # DIN's target attention (worker/model/target_attention.h): x_f = sum_i s_i a_i e_i,
            # a_i = MLP_att([e_i, c, e_i - c, e_i * c]), e_i unscaled, c = x_t (the target's one
            # entry, scaled); padding entries have s_i = 0. The first-order term keeps w's sum.
            if raw.ndim != 4:
                raise ValueError("a model with list.attention_target scores [n, F, L] ids "
                                 "(encode_values)")
            v = v.copy()
            for f, tf, att_hidden in self.attention:
                d = self.fields[f]["dim"]  # the history's and its target's dim (equal)
                e = raw[:, f, :, 1:1 + d]  # [n, L, d]
                c = np.broadcast_to(v[:, tf, None, :d], e.shape)
                u = np.concatenate([e, c, e - c, e * c], axis=2)
                for l in range(len(att_hidden)):
                    u = np.maximum(u @ t["att%d/mlp%d/w" % (f, l)] + t["att%d/mlp%d/b" % (f, l)],
                                   0.0)
                a = (u @ t["att%d/out/w" % f])[..., 0] + float(t["att%d/out/b" % f][0])
                v[:, f, :d] = (s[:, f, :, :] * a[..., None] * e).sum(axis=1)
        interaction = self.blocks["interaction"] if self.blocks is not None else NO_INTERACTION
        if self.model_type in (DEEPFM, FM) or interaction == FM_TERM:
            # The fields of a table whose dim is not k with fm_join EXCLUDE stay out of it.
            fm = v[:, [i for i, f in enumerate(self.fields) if not f["fm_excluded"]]]
            z += 0.5 * ((fm.sum(axis=1) ** 2) - (fm ** 2).sum(axis=1)).sum(axis=1)
        # x0: each field's d_f floats, in field order (all k without tables).
        if all(f["dim"] == v.shape[2] for f in self.fields):
            a = v.reshape(len(ids), -1)
        else:
            a = np.concatenate([v[:, i, :f["dim"]] for i, f in enumerate(self.fields)], axis=1)
        if interaction == CROSS_V2:
            # DCN-v2: x_{l+1} = x0 * (x_l W_l + b_l) + x_l, W_l = V_l U_l when low rank.
            x0, xl, l = a, a, 0
            while "cross%d/b" % l in t:
                if "cross%d/gate" % l in t:
                    # DCN-Mix (cross_network.h): sum_i p_i tanh(tanh(x V_i) C_i) U_i,
                    # p = softmax(x gate).
                    s = xl @ t["cross%d/gate" % l]
                    p = np.exp(s - s.max(axis=1, keepdims=True))
                    p /= p.sum(axis=1, keepdims=True)
                    y = 0
                    for i in range(p.shape[1]):
                        a = np.tanh(np.tanh(xl @ t["cross%d/v%d" % (l, i)])
                                    @ t["cross%d/c%d" % (l, i)])
                        y = y + p[:, i:i + 1] * (a @ t["cross%d/u%d" % (l, i)])
                elif "cross%d/w" % l in t:
                    y = xl @ t["cross%d/w" % l]
                else:
                    y = (xl @ t["cross%d/v" % l]) @ t["cross%d/u" % l]
                xl = x0 * (y + t["cross%d/b" % l]) + xl
                l += 1
            if "cross_out/w" in t:
                z += (xl @ t["cross_out/w"])[:, 0]
            if "cross_out/b" in t:
                z += float(t["cross_out/b"][0])
            if self.blocks["join"] == STACKED:
                a = xl
        elif interaction == DOT:
            # DLRM: [bottom MLP(dense fields' values), the pairwise dots of [bottom, x_1..x_F]].
            e, front = v, []
            if self.dense_fields:
                b, l = np.asarray(scales, dtype=np.float64)[:, self.dense_fields], 0
                while "bottom%d/w" % l in t:
                    b = np.maximum(b @ t["bottom%d/w" % l] + t["bottom%d/b" % l], 0.0)
                    l += 1
                e, front = np.concatenate([b[:, None, :], v], axis=1), [b]
            i, j = np.triu_indices(e.shape[1], 1)
            a = np.concatenate(front + [np.einsum("bik,bjk->bij", e, e)[:, i, j]], axis=1)
        if self.hidden:
            for l in range(len(self.hidden)):
                a = np.maximum(a @ t["mlp%d/w" % l] + t["mlp%d/b" % l], 0.0)
            z += (a @ t["out/w"])[:, 0] + float(t["out/b"][0])
        return z

    def predict(self, ids, scales):
        """Probabilities of encoded examples."""
        return 1.0 / (1.0 + np.exp(-self.logits(ids, scales)))


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

def _shape(d, key):
    return d.get(key, 0)


def _load_checkpoint(ckpt, verify):
    blocks = read_blocks(os.path.join(ckpt, "MANIFEST"), verify)
    if len(blocks) != 1 or blocks[0][0] != "MANI":
        raise FormatError("%s/MANIFEST: expected one 'MANI' block" % ckpt)
    manifest = parse_message(blocks[0][1], _MANIFEST)
    row_dim, dense_size = _shape(manifest, "row_dim"), _shape(manifest, "dense_size")
    ids, rows, states = [], [], []
    dense = np.zeros(dense_size, dtype=np.float32)
    dense_state = {}
    covered = np.zeros(dense_size, dtype=bool)
    dynamic_parts = {}  # table name -> [(path, DynamicSnapshot)], one per file
    for f in manifest.get("file", []):
        name = f["name"]
        if "/" in name or name in (".", ".."):
            raise FormatError("%s/MANIFEST lists '%s', not a file of the directory" % (ckpt, name))
        path = os.path.join(ckpt, name)
        if not name.startswith(("shard-", "dynamic-")):
            continue
        if not os.path.isfile(path):
            raise FormatError("%s: missing (the MANIFEST lists it)" % path)
        if os.path.getsize(path) != f.get("bytes"):
            raise FormatError("%s: %d bytes, MANIFEST says %s" % (path, os.path.getsize(path),
                                                                   f.get("bytes")))
        if name.startswith("dynamic-"):
            # `pstrain train`'s file of one dynamic table (docs/CHECKPOINT.md "Dynamic tables").
            snap = read_dynamic_file(path, verify)
            if snap.name != name[len("dynamic-"):]:
                raise FormatError("%s: holds dynamic table '%s', expected '%s'"
                                  % (path, snap.name, name[len("dynamic-"):]))
            dynamic_parts.setdefault(snap.name, []).append((path, snap))
            continue
        dim = state = None
        blocks = read_blocks(path, verify)
        group_end = 0  # the blocks of a DYNM group, read with it
        for index, (tag, payload) in enumerate(blocks):
            where = "%s: block %d ('%s')" % (path, index, tag)
            if index < group_end:
                continue
            if tag in ("DYNR", "DYND", "DYNS"):
                raise FormatError("%s: outside a 'DYNM' group" % where)
            if tag == "EMBM":
                if len(payload) != 48:
                    raise FormatError("%s: %d bytes, expected 48" % (where, len(payload)))
                begin, end, dim, _opt, state, _r, _last = struct.unpack("<qqIIIIq", payload[:40])
                # A table's group is at the table's width 1 + dim (compact widths), at most the
                # stride: its rows are read into the stride, zeros after (docs/CHECKPOINT.md).
                if not 1 <= dim <= row_dim:
                    raise FormatError("%s: rows of %d floats, MANIFEST says at most %d"
                                      % (where, dim, row_dim))
            elif tag == "EMBR":
                if dim is None:
                    raise FormatError("%s: rows before their EMBM block" % where)
                (n,) = struct.unpack_from("<I", payload, 0)
                want = 8 + n * (8 + 4 * (dim + state))
                if len(payload) != want:
                    raise FormatError("%s: %d bytes for %d rows, expected %d" % (where, len(payload), n, want))
                block_ids = np.frombuffer(payload, np.int64, n, 8)
                if n and (block_ids.min() < begin or block_ids.max() >= end):
                    raise FormatError("%s: row ids outside [%d, %d)" % (where, begin, end))
                ids.append(block_ids)
                narrow = np.frombuffer(payload, np.float32, n * dim, 8 + 8 * n).reshape(n, dim)
                rows.append(np.pad(narrow, ((0, 0), (0, row_dim - dim))) if dim < row_dim
                            else narrow)
                states.append(np.frombuffer(payload, np.float32, n * state,
                                            8 + 8 * n + 4 * n * dim).reshape(n, state))
            elif tag == "DYNM":
                # A PS shard's rows of a dynamic table: the keys this shard owns.
                snap, group_end = read_dynamic_group(path, blocks, index, os.path.getsize(path))
                dynamic_parts.setdefault(snap.name, []).append((path, snap))
            elif tag == "DNSE":
                begin, size, _opt, _r, sf, _last = struct.unpack_from("<qqIIqq", payload, 0)
                if len(payload) != 40 + 4 * (size + sf) or begin < 0 or begin + size > dense_size:
                    raise FormatError("%s: slice [%d, +%d) of %d bytes does not fit a dense vector "
                                      "of %d" % (where, begin, size, len(payload), dense_size))
                if covered[begin:begin + size].any():
                    raise FormatError("%s: dense slice [%d, +%d) overlaps another" % (where, begin, size))
                covered[begin:begin + size] = True
                dense[begin:begin + size] = np.frombuffer(payload, np.float32, size, 40)
                dense_state[begin] = np.frombuffer(payload, np.float32, sf, 40 + 4 * size)
    if not covered.all():
        raise FormatError("%s: %d dense floats are in none of its shard files"
                          % (ckpt, int((~covered).sum())))
    ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    order = np.argsort(ids, kind="stable")
    rows = np.concatenate(rows)[order] if rows else np.zeros((0, row_dim), np.float32)
    # The slots of tables at other widths have other sizes: then no row_state (None).
    same_slots = len({st.shape[1] for st in states}) == 1
    states = np.concatenate(states)[order] if states and same_slots else None
    ids = ids[order]
    if len(ids) > 1 and not (np.diff(ids) > 0).all():
        raise FormatError("%s: a row id appears in two shard files" % ckpt)
    dynamic = {name: _merge_dynamic_parts(ckpt, name, parts)
               for name, parts in dynamic_parts.items()}
    delta = manifest.get("delta")
    for name, snap in dynamic.items():
        if delta is None and snap.changed_since != 0:
            raise FormatError("%s: dynamic table '%s' is a delta (changed_since %d) in a full "
                              "checkpoint" % (ckpt, name, snap.changed_since))
    if delta is not None:
        # An incremental checkpoint: its rows over those of its parent's chain (docs/CHECKPOINT.md
        # "Incremental checkpoints"); the dense state is whole in every checkpoint.
        parent = delta.get("parent_step", -1)
        if not 0 <= parent < manifest.get("step", 0) or parent < delta.get("base_step", 0):
            raise FormatError("%s/MANIFEST: a delta whose parent ckpt-%d is not an older "
                              "checkpoint of its chain" % (ckpt, parent))
        older = _load_checkpoint(os.path.join(os.path.dirname(os.path.normpath(ckpt)),
                                              "ckpt-%d" % parent), verify)
        keep = ~np.isin(older.ids, ids)
        order = np.argsort(np.concatenate([older.ids[keep], ids]), kind="stable")
        ids = np.concatenate([older.ids[keep], ids])[order]
        rows = np.concatenate([older.rows[keep], rows])[order]
        if states is not None and older.row_state is not None:
            states = np.concatenate([older.row_state[keep], states])[order]
        # A dynamic table's delta: the older snapshot's rows less its tombstones, then its rows;
        # a full snapshot (changed_since 0) replaces the older one.
        for name, snap in dynamic.items():
            if snap.changed_since != 0:
                dynamic[name] = _apply_dynamic_delta(older.dynamic_snapshots.get(name), snap)
        for name, snap in older.dynamic_snapshots.items():
            if name not in dynamic:
                raise FormatError("%s: no file holds dynamic table '%s', which its parent "
                                  "ckpt-%d has" % (ckpt, name, parent))
    m = Model(ckpt, manifest.get("model"), ids, rows, dense, row_dim,
              _shape(manifest, "table_rows"), row_state=states, dense_state=dense_state,
              step=manifest.get("step"), version=manifest.get("step"))
    m.dynamic_snapshots = dynamic
    # The live rows by dynamic index, as an export's (so that lookup and predict read them).
    by_name = {t["name"]: t for t in m.dynamic_tables}
    for name, snap in dynamic.items():
        t = by_name.get(name)
        if t is None:
            if m.config is not None:
                raise FormatError("%s: dynamic table '%s' is not a dynamic table of its model "
                                  "description" % (ckpt, name))
            continue
        if snap.dim != t["width"]:
            raise FormatError("%s: dynamic table '%s' has rows of %d floats, its description "
                              "says %d" % (ckpt, name, snap.dim, t["width"]))
        m.dynamic[t["dynamic_index"]] = (snap.keys, snap.rows)
    missing = [t["name"] for t in m.dynamic_tables if t["name"] not in dynamic]
    if missing:
        raise FormatError("%s: no file holds dynamic table(s) %s of its model description "
                          "(expected a dynamic-<table> file or DYNM groups in the shard files)"
                          % (ckpt, missing))
    return m


# ---------------------------------------------------------------------------------------------
# Dynamic tables in checkpoints: DYNM, then DYNR, DYND, DYNS (ps/store/dynamic_file.h)
# ---------------------------------------------------------------------------------------------

_DYNAMIC_META_BYTES = 112
_MAX_NAME_BYTES = 4096
_MAX_TABLE_DIM = 1024  # common/config.h kMaxTableDim
_OPTIMIZERS = ("ADAGRAD", "SGD", "ADAM", "FTRL")  # OptimizerType numbers 0..3


class DynamicSnapshot:
    """One dynamic table's snapshot as a checkpoint holds it (ps/store/dynamic_store.h
    DynamicSnapshot), or a chain's result (full + deltas applied: no tombstones left).

    keys          uint64 [n], ascending: the key as the stores keep it, the low 55 bits of
                  hash_key(raw key, the table's seed) (0 -> 1; key 0 is the missing value's row):
                  dynamic_row(table index, key) is its row id
    rows          float32 [n, dim]: weights [w, v_0 .. v_{dim-2}] (dim = 1 + the table's dim)
    state         float32 [n, state_floats]: the optimizer slots, in the optimizer's layout
    counts, last_pass, last_step_of   uint32, int32, int64 [n]: each row's updates since its
                  admission, and the pass and step of its last update (what TTL / LRU / LFU use)
    deleted       uint64 [m]: a delta's tombstones (evicted keys); empty in a full snapshot and
                  in a chain's result
    sketch        uint32 [depth, width]: the COUNT admission's count-min sketch (None without);
                  of a PS checkpoint, the shards' sketches summed (saturating, as the C++ reader)
    dim, optimizer (OptimizerType number), state_floats, changed_since (0: full), pass_,
    last_step, admitted, rejected, evicted_ttl, evicted_capacity, seen (the store's counters;
    summed over a PS checkpoint's shards), name
    """

    def __init__(self, name, dim, optimizer, state_floats, changed_since, pass_, last_step,
                 counters, keys, rows, state, counts, last_pass, last_step_of, deleted, sketch):
        self.name, self.dim, self.optimizer, self.state_floats = name, dim, optimizer, state_floats
        self.changed_since, self.pass_, self.last_step = changed_since, pass_, last_step
        (self.admitted, self.rejected, self.evicted_ttl, self.evicted_capacity,
         self.seen) = counters
        self.keys, self.rows, self.state = keys, rows, state
        self.counts, self.last_pass, self.last_step_of = counts, last_pass, last_step_of
        self.deleted, self.sketch = deleted, sketch

    def counters(self):
        return (self.admitted, self.rejected, self.evicted_ttl, self.evicted_capacity, self.seen)

    def __repr__(self):
        return ("DynamicSnapshot(%r, dim=%d, rows=%d, deleted=%d, changed_since=%d, last_step=%d)"
                % (self.name, self.dim, len(self.keys), len(self.deleted), self.changed_since,
                   self.last_step))


def _ascending(a):
    return len(a) < 2 or bool((a[1:] > a[:-1]).all())


def read_dynamic_group(path, blocks, start, file_bytes):
    """The dynamic table group whose DYNM block is blocks[start] (blocks: read_blocks' list of
    the file `path` of `file_bytes` bytes), checked as ps/store/dynamic_file.cc
    ReadDynamicSnapshot checks it. Returns (DynamicSnapshot, the index after the group)."""
    tag, p = blocks[start]
    where = "%s: block %d ('%s')" % (path, start, tag)
    if tag != "DYNM":
        raise FormatError("%s: expected a 'DYNM' block" % where)
    if len(p) < _DYNAMIC_META_BYTES:
        raise FormatError("%s: a meta of %d bytes, expected at least %d"
                          % (where, len(p), _DYNAMIC_META_BYTES))
    (version, dim, optimizer, state_floats, changed_since, pass_, last_step, rows, deleted,
     sketch_width, sketch_depth, _r) = struct.unpack_from("<IiIiIiqQQQII", p, 0)
    counters = struct.unpack_from("<qqqqq", p, 64)
    name_bytes, _r = struct.unpack_from("<II", p, 104)
    if version == 0 or version > 1:
        raise FormatError("%s: a dynamic table of layout version %d, this reader reads 1%s"
                          % (where, version, " (a newer pstrain wrote it)" if version else ""))
    if name_bytes > _MAX_NAME_BYTES or len(p) != _DYNAMIC_META_BYTES + name_bytes:
        raise FormatError("%s: a name of %d bytes in a meta of %d bytes (expected %d + the name, "
                          "at most %d)" % (where, name_bytes, len(p), _DYNAMIC_META_BYTES,
                                          _MAX_NAME_BYTES))
    name = p[_DYNAMIC_META_BYTES:].decode("utf-8", "replace")
    where = "%s: block %d ('DYNM', table '%s')" % (path, start, name)
    if not 1 <= dim <= _MAX_TABLE_DIM + 1:
        raise FormatError("%s: dim %d, expected 1..%d" % (where, dim, _MAX_TABLE_DIM + 1))
    if optimizer >= len(_OPTIMIZERS):
        raise FormatError("%s: unknown optimizer %d, expected 0..%d"
                          % (where, optimizer, len(_OPTIMIZERS) - 1))
    if not 0 <= state_floats <= 4 * dim + 16:
        raise FormatError("%s: state_floats %d for dim %d" % (where, state_floats, dim))
    if last_step < 0 or min(counters) < 0:
        raise FormatError("%s: a negative step or counter" % where)
    if (sketch_width == 0) != (sketch_depth == 0) or sketch_depth > 16 or sketch_width > 1 << 32:
        raise FormatError("%s: a sketch of %d x %d counters (expected both 0, or width <= 2^32 "
                          "and depth 1..16)" % (where, sketch_width, sketch_depth))
    # Every count against what the file can hold, before anything is built for it.
    row_bytes = 8 + 4 + 4 + 8 + 4 * (dim + state_floats)
    if rows > file_bytes // row_bytes or deleted > file_bytes // 8 or \
            sketch_width * sketch_depth > file_bytes // 4:
        raise FormatError("%s: claims %d rows, %d tombstones and a %d x %d sketch, more than its "
                          "%d bytes can hold" % (where, rows, deleted, sketch_width, sketch_depth,
                                                 file_bytes))
    if changed_since == 0 and deleted > 0:
        raise FormatError("%s: a full snapshot (changed_since 0) with tombstones" % where)
    parts = {"DYNR": [], "DYND": [], "DYNS": []}
    stage, i, seen = 0, start + 1, [0, 0, 0]
    while i < len(blocks) and blocks[i][0] in parts:
        tag, b = blocks[i]
        where = "%s: block %d ('%s', table '%s')" % (path, i, tag, name)
        block_stage = ("DYNR", "DYND", "DYNS").index(tag)
        if block_stage < stage:
            raise FormatError("%s: out of order (expected rows, then tombstones, then the sketch)"
                              % where)
        stage = block_stage
        item = (row_bytes, 8, 4)[block_stage]
        n = struct.unpack_from("<I", b, 0)[0] if len(b) >= 8 else 0
        if len(b) < 8 or n == 0 or len(b) - 8 != n * item:
            raise FormatError("%s: %d bytes, expected 8 + n x %d with n >= 1 (n says %d)"
                              % (where, len(b), item, n))
        seen[block_stage] += n
        if seen[block_stage] > (rows, deleted, sketch_width * sketch_depth)[block_stage]:
            raise FormatError("%s: more %s than the meta's %d" % (
                where, ("rows", "tombstones", "sketch counters")[block_stage],
                (rows, deleted, sketch_width * sketch_depth)[block_stage]))
        parts[tag].append((n, b))
        i += 1
    if seen != [rows, deleted, sketch_width * sketch_depth]:
        raise FormatError("%s: dynamic table '%s' holds %d rows, %d tombstones and %d sketch "
                          "counters; its meta (block %d) says %d, %d and %d"
                          % (path, name, seen[0], seen[1], seen[2], start, rows, deleted,
                             sketch_width * sketch_depth))
    cols = {k: [] for k in ("keys", "counts", "last_pass", "last_step", "rows", "state")}
    for n, b in parts["DYNR"]:
        o = 8
        for key, dtype, width in (("keys", np.uint64, 1), ("counts", np.uint32, 1),
                                  ("last_pass", np.int32, 1), ("last_step", np.int64, 1),
                                  ("rows", np.float32, dim), ("state", np.float32, state_floats)):
            a = np.frombuffer(b, dtype, n * width, o)
            cols[key].append(a.reshape(n, width) if key in ("rows", "state") else a)
            o += n * width * np.dtype(dtype).itemsize

    def cat(key, dtype, width=None):
        if cols[key]:
            return np.concatenate(cols[key])
        return np.zeros((0, width) if width is not None else 0, dtype)

    keys = cat("keys", np.uint64)
    if not _ascending(keys):
        raise FormatError("%s: dynamic table '%s': keys not ascending and unique" % (path, name))
    dels = (np.concatenate([np.frombuffer(b, np.uint64, n, 8) for n, b in parts["DYND"]])
            if parts["DYND"] else np.zeros(0, np.uint64))
    if not _ascending(dels):
        raise FormatError("%s: dynamic table '%s': tombstones not ascending and unique"
                          % (path, name))
    sketch = None
    if sketch_depth:
        sketch = np.concatenate([np.frombuffer(b, np.uint32, n, 8)
                                 for n, b in parts["DYNS"]]).reshape(sketch_depth, sketch_width)
    snap = DynamicSnapshot(name, dim, optimizer, state_floats, changed_since, pass_, last_step,
                           counters, keys, cat("rows", np.float32, dim),
                           cat("state", np.float32, state_floats), cat("counts", np.uint32),
                           cat("last_pass", np.int32), cat("last_step", np.int64), dels, sketch)
    return snap, i


def read_dynamic_file(path, verify=True):
    """A `pstrain train` checkpoint's dynamic-<table> file: one group, then the end."""
    blocks = read_blocks(path, verify)
    if not blocks:
        raise FormatError("%s: expected a 'DYNM' block, found the end" % path)
    snap, end = read_dynamic_group(path, blocks, 0, os.path.getsize(path))
    if end != len(blocks):
        raise FormatError("%s: block %d ('%s'): expected the end of a dynamic table's file"
                          % (path, end, blocks[end][0]))
    return snap


def _merge_dynamic_parts(ckpt, name, parts):
    """One link's groups of table `name` (one per PS shard file: disjoint keys) as one snapshot,
    as ps/store/dynamic_checkpoint.cc merges them. parts: [(path, DynamicSnapshot)]."""
    first_path, first = parts[0]
    for path, p in parts[1:]:
        if (p.dim, p.optimizer, p.state_floats, p.changed_since > 0) != \
                (first.dim, first.optimizer, first.state_floats, first.changed_since > 0):
            raise FormatError("%s: dynamic table '%s' has another shape (dim %d, optimizer %d, "
                              "state %d, delta %s) than in %s (dim %d, optimizer %d, state %d, "
                              "delta %s)" % (path, name, p.dim, p.optimizer, p.state_floats,
                                             p.changed_since > 0, first_path, first.dim,
                                             first.optimizer, first.state_floats,
                                             first.changed_since > 0))
        if (p.sketch is None) != (first.sketch is None) or \
                (p.sketch is not None and p.sketch.shape != first.sketch.shape):
            raise FormatError("%s: dynamic table '%s': a sketch of another shape than in %s"
                              % (path, name, first_path))
    if len(parts) == 1:
        return first
    snaps = [p for _, p in parts]
    keys = np.concatenate([p.keys for p in snaps])
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    if not _ascending(keys):
        raise FormatError("%s: dynamic table '%s': a key in two shard files" % (ckpt, name))

    def cat(attr):
        return np.concatenate([getattr(p, attr) for p in snaps])[order]

    deleted = np.unique(np.concatenate([p.deleted for p in snaps]))
    sketch = None
    if first.sketch is not None:
        total = np.sum([p.sketch.astype(np.uint64) for p in snaps], axis=0)
        sketch = np.minimum(total, 0xFFFFFFFF).astype(np.uint32)
    counters = tuple(int(sum(c)) for c in zip(*(p.counters() for p in snaps)))
    return DynamicSnapshot(name, first.dim, first.optimizer, first.state_floats,
                           max(p.changed_since for p in snaps), max(p.pass_ for p in snaps),
                           max(p.last_step for p in snaps), counters, keys, cat("rows"),
                           cat("state"), cat("counts"), cat("last_pass"), cat("last_step_of"),
                           deleted, sketch)


def _apply_dynamic_delta(older, delta):
    """A delta on the chain's snapshot before it: its tombstones deleted, then its rows written
    (DynamicEmbeddingStore::Restore of a delta). The result has no tombstones."""
    if older is None:
        older = DynamicSnapshot(delta.name, delta.dim, delta.optimizer, delta.state_floats, 0, 0,
                                0, (0,) * 5, np.zeros(0, np.uint64),
                                np.zeros((0, delta.dim), np.float32),
                                np.zeros((0, delta.state_floats), np.float32),
                                np.zeros(0, np.uint32), np.zeros(0, np.int32),
                                np.zeros(0, np.int64), np.zeros(0, np.uint64), None)
    keep = ~np.isin(older.keys, delta.deleted) & ~np.isin(older.keys, delta.keys)
    keys = np.concatenate([older.keys[keep], delta.keys])
    order = np.argsort(keys, kind="stable")

    def cat(attr):
        return np.concatenate([getattr(older, attr)[keep], getattr(delta, attr)])[order]

    return DynamicSnapshot(delta.name, delta.dim, delta.optimizer, delta.state_floats,
                           delta.changed_since, delta.pass_, delta.last_step, delta.counters(),
                           keys[order], cat("rows"), cat("state"), cat("counts"),
                           cat("last_pass"), cat("last_step_of"), np.zeros(0, np.uint64),
                           delta.sketch)


def _bf16(raw):
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _decode_rows(body, enc, n, width, row_bytes):
    """n rows of `width` floats from their encoded bytes (docs/SERVING.md)."""
    if enc == 0:
        return body.view(np.float32).reshape(n, width)
    if enc == 1:
        return _bf16(body.view(np.uint16)).reshape(n, width)
    per = body.reshape(n, row_bytes)
    w = per[:, 0:4].copy().view(np.float32)[:, 0]
    scale = per[:, 4:8].copy().view(np.float32)[:, 0]
    q = per[:, 8:].view(np.int8).astype(np.float32)
    return np.concatenate([w[:, None], q * scale[:, None]], axis=1).astype(np.float32)


def _load_export(version_dir, verify):
    path = os.path.join(version_dir, "MODEL")
    blocks = read_blocks(path, verify)
    if len(blocks) < 2 or blocks[0][0] != "MODL" or blocks[1][0] != "XDNS":
        raise FormatError("%s: expected the 'MODL' then the 'XDNS' block: not a pstrain export" % path)
    h = parse_message(blocks[0][1], _EXPORT_HEADER)
    version = h.get("format_version")
    if version not in (1, 2, 3):
        raise FormatError("%s: export format version %s, this reader reads 1 to 3" % (path, version))
    has_dynamic = any("dynamic" in t for t in h.get("model", {}).get("features", {}).get("table", []))
    if version < 3 and (has_dynamic or h.get("dynamic_rows", 0)):
        raise FormatError("%s: format version %d cannot hold dynamic tables" % (path, version))
    if version == 1 and h.get("model", {}).get("features", {}).get("table"):
        raise FormatError("%s: format version 1 cannot hold tables (features.table)" % path)
    dim, enc = h["row_dim"], h.get("row_encoding", 0)
    dense = np.frombuffer(blocks[1][1], np.float32).copy()
    if len(dense) != h.get("dense_size", 0):
        raise FormatError("%s: %d dense floats, the header says %d" % (path, len(dense), h.get("dense_size", 0)))
    if enc not in (0, 1, 2):
        raise FormatError("%s: unknown row encoding %d" % (path, enc))
    tensors = [(t["name"], t.get("offset", 0), tuple(t.get("shape", [])))
               for t in h.get("dense_tensor", [])] or None
    m = Model(version_dir, h.get("model"), np.zeros(0, np.int64), np.zeros((0, dim), np.float32),
              dense, dim, h["table_rows"], tensors=tensors, step=h.get("step"),
              version=h.get("version"))
    ids, rows = [], []
    dynamic = {}  # table -> ([keys], [rows])
    last = (-1, -1)
    for index, (tag, payload) in enumerate(blocks[2:], start=2):
        if tag == "XDYN" and version >= 3:
            # A dynamic table's live rows: n, encoding, table, reserved, keys, rows at 1 + dim.
            if len(payload) < 16:
                raise FormatError("%s: block %d ('XDYN'): shorter than its 16-byte header"
                                  % (path, index))
            n, block_enc, table, _ = struct.unpack_from("<IIII", payload, 0)
            if table >= len(m.dynamic_tables):
                raise FormatError("%s: block %d ('XDYN'): dynamic table %d, the model has %d"
                                  % (path, index, table, len(m.dynamic_tables)))
            width = m.dynamic_tables[table]["width"]
            row_bytes = {0: 4 * width, 1: 2 * width, 2: 8 + width - 1}[enc]
            if block_enc != enc or n == 0 or len(payload) != 16 + n * (8 + row_bytes):
                raise FormatError("%s: block %d ('XDYN'): %d bytes for %d rows of encoding %d; "
                                  "expected encoding %d, rows of %d floats"
                                  % (path, index, len(payload), n, block_enc, enc, width))
            keys = np.frombuffer(payload, np.uint64, n, 16)
            if (table, int(keys[0])) <= last or (n > 1 and not (np.diff(keys) > 0).all()):
                raise FormatError("%s: block %d ('XDYN'): keys not (table, key) ascending"
                                  % (path, index))
            last = (table, int(keys[-1]))
            body = np.frombuffer(payload, np.uint8, n * row_bytes, 16 + 8 * n)
            d = dynamic.setdefault(table, ([], []))
            d[0].append(keys)
            d[1].append(_decode_rows(body, enc, n, width, row_bytes))
            continue
        if tag != "XROW":
            continue
        n, block_enc = struct.unpack_from("<II", payload, 0)
        # A block holds one table's rows, each at its table's width (version 2; 1: one table).
        first = struct.unpack_from("<q", payload, 8)[0] if n and len(payload) >= 16 else 0
        table = m.row_table(first) if 0 <= first < m.table_rows else m.tables[0]
        width = table["width"]
        row_bytes = {0: 4 * width, 1: 2 * width, 2: 8 + width - 1}[enc]
        if block_enc != enc or len(payload) != 8 + n * (8 + row_bytes):
            raise FormatError("%s: block %d ('XROW'): %d bytes for %d rows of encoding %d; expected "
                              "encoding %d, rows of %d floats" % (path, index, len(payload), n,
                                                                   block_enc, enc, width))
        block_ids = np.frombuffer(payload, np.int64, n, 8)
        if n and (block_ids[0] < table["begin"] or block_ids[-1] >= table["end"]):
            raise FormatError("%s: block %d ('XROW'): row ids [%d, %d] outside table '%s' [%d, %d): "
                              "a block holds one table's rows" % (path, index, block_ids[0],
                                                                   block_ids[-1], table["name"],
                                                                   table["begin"], table["end"]))
        ids.append(block_ids)
        body = np.frombuffer(payload, np.uint8, n * row_bytes, 8 + 8 * n)
        r = _decode_rows(body, enc, n, width, row_bytes)
        if width < dim:  # to the stride: zeros after the table's width
            r = np.concatenate([r, np.zeros((n, dim - width), np.float32)], axis=1)
        rows.append(r)
    ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    rows = np.concatenate(rows) if rows else np.zeros((0, dim), np.float32)
    if len(ids) != h.get("rows", 0):
        raise FormatError("%s: %d rows in its blocks, the header says %d" % (path, len(ids), h.get("rows", 0)))
    if len(ids) and (not (np.diff(ids) > 0).all() or ids[0] < 0 or ids[-1] >= h["table_rows"]):
        raise FormatError("%s: row ids not ascending inside [0, %d)" % (path, h["table_rows"]))
    m.ids, m.rows = ids, rows
    m.dynamic = {t: (np.concatenate(k), np.concatenate(r)) for t, (k, r) in dynamic.items()}
    if sum(len(k) for k, _ in m.dynamic.values()) != h.get("dynamic_rows", 0):
        raise FormatError("%s: %d dynamic rows in its blocks, the header says %d"
                          % (path, sum(len(k) for k, _ in m.dynamic.values()),
                             h.get("dynamic_rows", 0)))
    return m


def _newest_version(base):
    versions = [int(n) for n in os.listdir(base)
                if n.isdigit() and (n == "0" or not n.startswith("0"))
                and os.path.isfile(os.path.join(base, n, "MODEL"))]
    return os.path.join(base, str(max(versions))) if versions else None


def load(path, verify=True):
    """A checkpoint (a model dir with LATEST, or a ckpt-<step> directory) or an export (a base
    directory of versions, or one version directory) as a Model."""
    if os.path.isfile(os.path.join(path, "MODEL")):
        return _load_export(path, verify)
    if os.path.isfile(os.path.join(path, "MANIFEST")):
        return _load_checkpoint(path, verify)
    if os.path.isfile(os.path.join(path, "LATEST")):
        with open(os.path.join(path, "LATEST")) as f:
            name = f.read().strip()
        if not name.startswith("ckpt-") or not name[5:].isdigit():
            raise FormatError("%s/LATEST: expected 'ckpt-<step>', got %r" % (path, name))
        return _load_checkpoint(os.path.join(path, name), verify)
    if os.path.isdir(path):
        newest = _newest_version(path)
        if newest is not None:
            return _load_export(newest, verify)
    raise FormatError("%s: neither a checkpoint (LATEST, MANIFEST) nor an export (MODEL, "
                      "<version>/MODEL)" % path)
