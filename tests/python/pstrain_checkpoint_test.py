#!/usr/bin/python3
"""Tests of python/pstrain_checkpoint.py and python/serve_client.py against the C++ binary.

usage: pstrain_checkpoint_test.py PSTRAIN_BINARY SOURCE_DIR [unittest args]

Trains a small DeepFM with `pstrain train` (every test process makes its own), then checks that
the reader's arrays are the checkpoint's, that its forward pass of the exported model gives the
C++ scores (`pstrain predict`) to 1e-5, rows never trained included (its Model::InitRow twin),
that an int8 export and a PS fixture read, that damage is refused, and that the gRPC client
example scores through a real `pstrain serve` as the reader does; and the same for a model with
list fields and shared rows, for models with tables (docs/CONFIG.md "Tables": the reader,
predict and serve agree), and for a model with dynamic tables trained on the PS.
"""

import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

BINARY = sys.argv[1]
SOURCE = sys.argv[2]
sys.path.insert(0, os.path.join(SOURCE, "python"))
import pstrain_checkpoint as pc  # noqa: E402

CONFIG = """
data { train { name: "train" format: CRITEO_TSV } shuffle_buffer: 1000 }
features { preset: CRITEO categorical_vocab_size: 20000 }
model { type: DEEPFM embedding_dim: 8 hidden: [ 32, 16 ] }
sparse_optimizer { type: ADAGRAD learning_rate: 0.05 initial_accumulator: 0.0001 }
dense_optimizer { type: ADAM learning_rate: 0.001 }
train { batch_size: 64 epochs: 1 log_every_steps: 100000 }
threads { towers: 2 intra_op_threads: 1 inter_op_threads: 1 }
"""


def run(*args):
    r = subprocess.run([BINARY] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=300, universal_newlines=True)
    if r.returncode != 0:
        raise AssertionError("pstrain %s failed:\n%s" % (" ".join(args), r.stdout))
    return r.stdout


class Fixture:
    dir = None


def setUpModule():
    Fixture.dir = tempfile.mkdtemp(prefix="pstrain_py_")
    d = Fixture.dir
    with open(os.path.join(d, "config.textproto"), "w") as f:
        f.write(CONFIG)
    run("datagen", "--rows", "3000", "--seed", "1", "--out", os.path.join(d, "train"))
    run("datagen", "--rows", "600", "--seed", "2", "--out", os.path.join(d, "test"))
    run("train", "--config", os.path.join(d, "config.textproto"), "--train",
        os.path.join(d, "train", "part-*"), "--model_dir", os.path.join(d, "m"))
    # The same training with incremental checkpoints (every 5 steps, never a second full one):
    # its last checkpoint is a delta whose chain the reader must follow.
    run("train", "--config", os.path.join(d, "config.textproto"), "--train",
        os.path.join(d, "train", "part-*"), "--model_dir", os.path.join(d, "m_incr"),
        "--set", "checkpoint.every_steps=5", "--set", "checkpoint.incremental_every=100",
        "--set", "checkpoint.keep=2")
    Fixture.test = os.path.join(d, "test", "part-00000.tsv")
    run("predict", "--model_dir", os.path.join(d, "m"), "--input", Fixture.test, "--out",
        os.path.join(d, "scores.tsv"))
    for rows in ("f32", "int8"):
        run("export", "--model_dir", os.path.join(d, "m"), "--out", os.path.join(d, "export_" + rows),
            "--rows", rows)
    with open(Fixture.test) as f:
        Fixture.lines = f.readlines()
    Fixture.scores = np.loadtxt(os.path.join(d, "scores.tsv"), dtype=np.float64)[:, 0]


def tearDownModule():
    shutil.rmtree(Fixture.dir, ignore_errors=True)


class ReaderTest(unittest.TestCase):
    def test_the_exports_forward_pass_gives_the_cpp_scores(self):
        m = pc.load(os.path.join(Fixture.dir, "export_f32"))
        self.assertEqual(m.config["model"]["hidden"], [32, 16])
        self.assertEqual(len(m.fields), 39)
        self.assertEqual(m.fields[13]["name"], "C1")
        self.assertEqual(m.tensors["mlp0/w"].shape, (39 * 8, 32))
        ids, scales, labels = m.encode_criteo(Fixture.lines)
        probs = m.predict(ids, scales)
        self.assertEqual(len(probs), 600)
        np.testing.assert_allclose(probs, Fixture.scores, rtol=0, atol=1e-5)
        # The test rows reach rows never trained: their values come from the InitRow twin.
        stored = np.isin(ids.ravel(), m.ids)
        self.assertGreater(int((~stored).sum()), 100)
        self.assertTrue(np.array_equal(labels[:3], [float(l[0]) for l in Fixture.lines[:3]]))

    def test_init_row_is_the_cpp_rule(self):
        # Golden values of Model::InitRow (tests/serving/serving_model_test.cc
        # RowsNeverTrainedReadAsTheDocumentedInitRule pins the C++ side to the same numbers).
        m = pc.Model("golden", None, np.zeros(0, np.int64), np.zeros((0, 5), np.float32),
                     np.zeros(1, np.float32), 5, 170)
        m.config = {"init_seed": 9, "model": {"embedding_init_stddev": 0.05}}
        want = {0: [0, -0.0954230055, -0.0210496709, 0.0176667515, -0.00829756539],
                1: [0, 0.0442207977, 0.0220386144, 0.0666234121, -0.0896068513],
                169: [0, 0.00583246443, -0.0327057838, -0.0704622939, 0.035526827]}
        for r, row in want.items():
            self.assertTrue(np.array_equal(m.init_row(r), np.array(row, np.float32)), r)

    def test_checkpoint_and_export_hold_the_same_arrays(self):
        ck = pc.load(os.path.join(Fixture.dir, "m"))
        ex = pc.load(os.path.join(Fixture.dir, "export_f32"))
        self.assertTrue(np.array_equal(ck.ids, ex.ids))
        self.assertTrue(np.array_equal(ck.rows, ex.rows))
        self.assertTrue(np.array_equal(ck.dense, ex.dense))
        self.assertEqual(ck.step, ex.step)
        # The checkpoint's Adagrad slots: one accumulator per weight, positive.
        self.assertEqual(ck.row_state.shape, ck.rows.shape)
        self.assertTrue((ck.row_state > 0).all())
        self.assertEqual(sum(len(s) for s in ck.dense_state.values()), 2 * len(ck.dense) + 1)
        for name, t in ck.tensors.items():
            self.assertTrue(np.array_equal(t, ex.tensors[name]), name)

    def test_a_delta_checkpoint_reads_through_its_chain(self):
        full = pc.load(os.path.join(Fixture.dir, "m"))
        incr_dir = os.path.join(Fixture.dir, "m_incr")
        self.assertIn("ckpt-5", os.listdir(incr_dir))  # the base, kept for the chain
        incr = pc.load(incr_dir)
        self.assertEqual(incr.step, full.step)
        self.assertGreater(len(incr.ids), 1000)
        self.assertTrue(np.array_equal(incr.ids, full.ids))
        self.assertTrue(np.array_equal(incr.rows, full.rows))
        self.assertTrue(np.array_equal(incr.row_state, full.row_state))
        self.assertTrue(np.array_equal(incr.dense, full.dense))
        # The delta alone holds fewer rows: the chain is what completes it.
        latest = open(os.path.join(incr_dir, "LATEST")).read().strip()
        manifest = pc.parse_message(pc.read_blocks(os.path.join(incr_dir, latest, "MANIFEST"),
                                                   True)[0][1], pc._MANIFEST)
        self.assertEqual(manifest["delta"]["base_step"], 5)
        self.assertEqual(manifest["version"], 3)

    def test_int8_export_is_close(self):
        f32 = pc.load(os.path.join(Fixture.dir, "export_f32"))
        q = pc.load(os.path.join(Fixture.dir, "export_int8"))
        self.assertTrue(np.array_equal(f32.ids, q.ids))
        self.assertTrue(np.array_equal(f32.rows[:, 0], q.rows[:, 0]))  # w is kept exact
        scale = np.abs(f32.rows[:, 1:]).max(axis=1, keepdims=True) / 127
        self.assertTrue((np.abs(q.rows[:, 1:] - f32.rows[:, 1:]) <= scale * 0.5001 + 1e-12).all())
        ids, scales, _ = f32.encode_criteo(Fixture.lines)
        self.assertLess(float(np.abs(q.predict(ids, scales) - f32.predict(ids, scales)).max()), 0.01)

    def test_the_version1_ps_fixture_reads(self):
        m = pc.load(os.path.join(SOURCE, "tests", "checkpoint", "testdata", "ps_v1"))
        self.assertIsNone(m.config)  # written before checkpoints recorded their model
        self.assertEqual(m.ids.tolist(), [1, 5, 9])
        self.assertEqual(m.rows.tolist(), [[0.875, 1.375], [4.875, 5.375], [8.875, 9.375]])
        self.assertEqual(m.dense.tolist(), [-1.25, -0.8125, -0.375, 0.0625, 0.5])
        self.assertEqual(m.row_state.tolist(), [[1, 1]] * 3)

    def test_damage_is_refused_naming_the_place(self):
        src = os.path.join(Fixture.dir, "export_f32")
        version = os.listdir(src)[0]
        bad = os.path.join(Fixture.dir, "bad_export", version)
        shutil.copytree(os.path.join(src, version), bad)
        path = os.path.join(bad, "MODEL")
        with open(path, "rb") as f:
            data = bytearray(f.read())
        data[len(data) // 2] ^= 0x20
        with open(path, "wb") as f:
            f.write(bytes(data))
        with self.assertRaises(pc.FormatError) as e:
            pc.load(bad)
        self.assertIn(path, str(e.exception))
        self.assertIn("checksum mismatch", str(e.exception))
        with self.assertRaises(pc.FormatError):
            pc.load(os.path.join(Fixture.dir, "test"))  # not a model at all

    def test_hashing_golden(self):
        # The golden values of tests/common/hash_test.cc.
        self.assertEqual(pc.hash_bytes(b""), 0xCBF29CE484222325)
        self.assertEqual(pc.hash_bytes(b"a"), 0xAF63DC4C8601EC8C)
        self.assertEqual(pc.log_squared_bucket(3.0), 1)
        self.assertEqual(pc.log_squared_bucket(1000.0), 47)
        self.assertEqual(pc.log_squared_bucket(-2.5), -2)


class ServeClientTest(unittest.TestCase):
    def test_the_client_scores_through_pstrain_serve(self):
        sys.path.insert(0, os.path.join(SOURCE, "python"))
        import serve_client  # noqa: E402
        export = os.path.join(Fixture.dir, "export_int8")
        server = subprocess.Popen([BINARY, "serve", "--model", export, "--port", "0"],
                                  stdout=subprocess.PIPE, universal_newlines=True)
        try:
            line = server.stdout.readline()  # "pstrain serve: ... listening on HOST:PORT"
            self.assertIn("listening on", line)
            client = serve_client.ServeClient(line.rsplit(" ", 1)[1].strip(), timeout=30)
            self.assertEqual(client.health(), "SERVING")
            self.assertEqual(client.health("pstrain.Predictor"), "SERVING")
            self.assertEqual(len(client.info().field), 39)
            probs, version = client.predict_tsv(Fixture.lines[:100], have_label=True)
            m = pc.load(export)
            self.assertEqual(version, m.version)
            ids, scales, _ = m.encode_criteo(Fixture.lines[:100])
            np.testing.assert_allclose(probs, m.predict(ids, scales), rtol=0, atol=1e-5)
            # Examples by name give the same scores as the raw rows.
            cols = Fixture.lines[0].rstrip("\n").split("\t")[1:]
            ex = {}
            for i, v in enumerate(cols):
                if v:
                    ex["I%d" % (i + 1) if i < 13 else "C%d" % (i - 12)] = float(v) if i < 13 else v
            one, _ = client.predict_examples([ex])
            self.assertAlmostEqual(one[0], probs[0], places=6)
        finally:
            server.send_signal(signal.SIGTERM)
            self.assertEqual(server.wait(timeout=60), 0)
            server.stdout.close()


# DCN_V2 (parallel, low rank) and DLRM (with DENSE numeric fields, so its bottom MLP): the reader's
# forward pass of the export and of the checkpoint (whose layout it derives from the recorded
# blocks) gives `pstrain predict`'s scores.
BLOCK_MODELS = {
    "dcn_v2": 'features { preset: CRITEO categorical_vocab_size: 20000 }\n'
              'model { type: DCN_V2 embedding_dim: 8 hidden: [ 16 ] '
              'blocks { cross_layers: 2 cross_rank: 4 join: PARALLEL } }\n',
    "dcn_v2_stacked": 'features { preset: CRITEO categorical_vocab_size: 20000 }\n'
                      'model { type: DCN_V2 embedding_dim: 4 hidden: [ 16 ] '
                      'blocks { cross_layers: 2 } }\n',
    # DCN-Mix: 3 low-rank experts per cross layer; also served (python == predict == serve).
    "dcn_mix": 'features { preset: CRITEO categorical_vocab_size: 20000 }\n'
               'model { type: DCN_V2 embedding_dim: 4 hidden: [ 16 ] '
               'blocks { cross_layers: 2 cross_rank: 4 cross_experts: 3 } }\n',
    "dlrm": 'features { preset: CRITEO categorical_vocab_size: 20000 numeric_mode: DENSE }\n'
            'model { type: DLRM embedding_dim: 8 hidden: [ 16 ] blocks { bottom_hidden: [ 8 ] } }\n',
}


class BlockModelsReaderTest(unittest.TestCase):
    def test_the_block_models_forward_pass_gives_the_cpp_scores(self):
        d = Fixture.dir
        base = "\n".join(l for l in CONFIG.splitlines()
                         if not l.startswith(("features", "model")))
        for name, model in BLOCK_MODELS.items():
            with self.subTest(model=name):
                config = os.path.join(d, name + ".textproto")
                with open(config, "w") as f:
                    f.write(base + "\n" + model)
                mdir = os.path.join(d, name)
                run("train", "--config", config, "--train", os.path.join(d, "train", "part-*"),
                    "--model_dir", mdir)
                scores = os.path.join(d, name + "_scores.tsv")
                run("predict", "--model_dir", mdir, "--input", Fixture.test, "--out", scores)
                want = np.loadtxt(scores, dtype=np.float64)[:, 0]
                run("export", "--model_dir", mdir, "--out", mdir + "_export", "--rows", "f32")
                for path in (mdir + "_export", mdir):
                    m = pc.load(path)
                    ids, scales, _ = m.encode_criteo(Fixture.lines)
                    probs = m.predict(ids, scales)
                    np.testing.assert_allclose(probs, want, rtol=0, atol=1e-5, err_msg=path)
                    self.assertGreater(float(np.std(probs)), 1e-3)  # not a constant model
                m = pc.load(mdir)
                if name == "dlrm":
                    self.assertEqual(m.dense_fields, list(range(13)))
                    self.assertEqual(m.tensors["bottom1/w"].shape, (8, 8))
                    self.assertEqual(m.tensors["mlp0/w"].shape, (8 + 40 * 39 // 2, 16))
                elif name == "dcn_v2":
                    self.assertEqual(m.tensors["cross1/v"].shape, (39 * 8, 4))
                    self.assertEqual(m.tensors["cross_out/w"].shape, (39 * 8, 1))
                elif name == "dcn_mix":
                    self.assertEqual(m.tensors["cross1/v2"].shape, (39 * 4, 4))
                    self.assertEqual(m.tensors["cross1/c2"].shape, (4, 4))
                    self.assertEqual(m.tensors["cross0/gate"].shape, (39 * 4, 3))
                    # The gate and the experts matter: dropping them scores otherwise, by more
                    # than the 1e-5 the match allows (little: x0 is small after this short run).
                    plain = pc.load(mdir + "_export")
                    for l in range(2):
                        del plain.tensors["cross%d/gate" % l]
                        plain.tensors["cross%d/w" % l] = np.zeros((39 * 4, 39 * 4), np.float32)
                    self.assertGreater(float(np.abs(plain.predict(ids, scales) - want).max()),
                                       1e-4)
                    server = subprocess.Popen(
                        [BINARY, "serve", "--model", mdir + "_export", "--port", "0"],
                        stdout=subprocess.PIPE, universal_newlines=True)
                    try:
                        line = server.stdout.readline()
                        self.assertIn("listening on", line)
                        import serve_client  # noqa: E402
                        client = serve_client.ServeClient(line.rsplit(" ", 1)[1].strip(),
                                                          timeout=30)
                        served, _ = client.predict_tsv(Fixture.lines, have_label=True)
                        np.testing.assert_allclose(served, want, rtol=0, atol=1e-6)
                    finally:
                        server.send_signal(signal.SIGTERM)
                        self.assertEqual(server.wait(timeout=60), 0)
                        server.stdout.close()


# A DeepFM with list fields (docs/FORMATS.md "Lists"): `history` (MEAN, max_length 6, so that
# longer lists are cut) shares the rows of `item`; `kw` is a SUM list with weights and its own
# separator; `price` a DENSE number. The reader scores its export and its checkpoint as
# `pstrain predict` does, and `pstrain serve` scores CSV rows and examples carrying the lists
# alike.
LIST_CONFIG = """
data { train { name: "train" format: CSV } shuffle_buffer: 1000 }
features {
  preset: NO_PRESET
  field { name: "item" vocab_size: 500 }
  field { name: "history" share_rows_with: "item" list { combiner: MEAN max_length: 6 } }
  field { name: "kw" vocab_size: 50 list { combiner: SUM separator: ";" } }
  field { name: "price" kind: NUMERIC numeric_mode: DENSE }
}
model { type: DEEPFM embedding_dim: 4 hidden: [ 16 ] }
sparse_optimizer { type: ADAGRAD learning_rate: 0.1 initial_accumulator: 0.0001 }
dense_optimizer { type: ADAM learning_rate: 0.003 }
train { batch_size: 64 epochs: 2 log_every_steps: 100000 }
threads { towers: 2 intra_op_threads: 1 inter_op_threads: 1 }
"""


def list_csv(rows, seed):
    """label,item,history,kw,price: a click is likelier when the item's topic (item % 4) is the
    history's; lists of 0..9 ids (some empty, some over max_length), kw ids with weights."""
    rng = np.random.RandomState(seed)
    out = ["label,item,history,kw,price"]
    for _ in range(rows):
        topic, item = rng.randint(4), rng.randint(200)
        click = rng.rand() < (0.8 if item % 4 == topic else 0.2)
        hist = "|".join("i%d" % (4 * rng.randint(50) + topic) for _ in range(rng.randint(10)))
        kw = ";".join("k%d:%g" % (rng.randint(30), rng.randint(1, 4) / 2.0)
                      for _ in range(rng.randint(4)))
        out.append("%d,i%d,%s,%s,%s" % (click, item, hist, kw, rng.randint(100)))
    return "\n".join(out) + "\n"


class ListsReaderTest(unittest.TestCase):
    def test_lists_score_as_predict_and_serve(self):
        d = os.path.join(Fixture.dir, "lists")
        os.makedirs(d)
        paths = {}
        for name, text in (("train.csv", list_csv(3000, 1)), ("test.csv", list_csv(400, 2)),
                           ("config.textproto", LIST_CONFIG)):
            paths[name] = os.path.join(d, name)
            with open(paths[name], "w") as f:
                f.write(text)
        mdir, export = os.path.join(d, "m"), os.path.join(d, "export")
        run("train", "--config", paths["config.textproto"], "--train", paths["train.csv"],
            "--model_dir", mdir)
        scores = os.path.join(d, "scores.tsv")
        run("predict", "--model_dir", mdir, "--input", paths["test.csv"], "--format", "csv",
            "--out", scores)
        want = np.loadtxt(scores, dtype=np.float64)[:, 0]
        run("export", "--model_dir", mdir, "--out", export, "--rows", "f32")
        with open(paths["test.csv"]) as f:
            lines = f.read().splitlines()[1:]
        rows = [l.split(",")[1:] for l in lines]
        values = [[c or None for c in r[:1]] + r[1:3] + [float(r[3])] for r in rows]
        for path in (export, mdir):
            m = pc.load(path)
            self.assertEqual(m.fields[1]["offset"], m.fields[0]["offset"])  # shared rows
            self.assertEqual(m.fields[1]["seed"], m.fields[0]["seed"])
            self.assertEqual(m.fields[2]["list"]["separator"], ";")
            ids, scales = m.encode_values(values)
            self.assertEqual(ids.shape, (400, 4, 6))  # history cut to 6
            probs = m.predict(ids, scales)
            np.testing.assert_allclose(probs, want, rtol=0, atol=1e-5, err_msg=path)
            self.assertGreater(float(np.std(probs)), 1e-2)  # the lists matter
        # Truncation and the combiners, by hand: 8 ids cut to 6, MEAN over the kept weights;
        # an empty list is the missing row; keys or (key, weight) pairs read as the text does.
        m = pc.load(export)
        a, sa = m.encode_values([["i1", "i1|i2|i3|i4|i5|i6|i7|i8", "k1:2;k2", 1.0]])
        self.assertEqual(list(sa[0, 1]), [np.float32(1 / 6.0)] * 6)
        self.assertEqual(list(sa[0, 2, :3]), [2.0, 1.0, 0.0])
        self.assertEqual(a[0, 1, 0], a[0, 0, 0])  # history's i1 is item's i1's row
        b, sb = m.encode_values([["i1", [0x1, "i2", "i3", "i4", "i5", "i6"], [("k1", 2.0), "k2"],
                                  1.0]])
        self.assertEqual(a[0, 2, 0], b[0, 2, 0])
        self.assertEqual(list(sb[0, 2, :2]), [2.0, 1.0])
        e, se = m.encode_values([["i1", "", None, 1.0]])
        self.assertEqual((e[0, 1, 0], se[0, 1, 0]), (m.fields[1]["offset"], 1.0))
        with self.assertRaises(ValueError) as err:
            m.encode_values([["i1", "a||b", "", 1.0]])
        self.assertIn("field 'history'", str(err.exception))

        # A ListSpec field this reader does not know (a newer pooling) is refused, not ignored.
        self.assertEqual(pc.parse_message(bytes([0x08, 0x01, 0x40, 0x02]), pc._LIST),
                         {"combiner": 1, "_unknown": [8]})
        config = {"features": {"preset": 0, "field": [
            {"name": "a", "vocab_size": 10, "list": {"_unknown": [8]}}]},
            "model": {"type": pc.FM, "embedding_dim": 4}}
        with self.assertRaises(pc.FormatError) as err:
            pc.Model("x", config, np.zeros(0, np.int64), np.zeros((0, 5), np.float32),
                     np.zeros(1, np.float32), 5, 10)
        self.assertIn("field 'a' list sets ListSpec field(s) [8]", str(err.exception))

        # `pstrain serve`: CSV rows with the label, and examples with the lists as text.
        import serve_client  # noqa: E402
        server = subprocess.Popen([BINARY, "serve", "--model", export, "--port", "0"],
                                  stdout=subprocess.PIPE, universal_newlines=True)
        try:
            line = server.stdout.readline()
            self.assertIn("listening on", line)
            client = serve_client.ServeClient(line.rsplit(" ", 1)[1].strip(), timeout=30)
            served, _ = client.predict_tsv(lines, have_label=True, csv=True)
            np.testing.assert_allclose(served, want, rtol=0, atol=1e-6)
            examples = [{k: v for k, v in zip(("item", "history", "kw", "price"), r[:3] +
                                             [float(r[3])]) if v != ""} for r in rows[:20]]
            one, _ = client.predict_examples(examples)
            np.testing.assert_allclose(one, want[:20], rtol=0, atol=1e-6)
        finally:
            server.send_signal(signal.SIGTERM)
            self.assertEqual(server.wait(timeout=60), 0)
            server.stdout.close()


# Tables (docs/CONFIG.md "Tables"): `item` (k = 4, UNIFORM) shared by the candidate and a
# history list, `cats` (TRUNCATED_NORMAL), and `user` in the default table. The test rows carry
# cats never seen in training, so that untrained rows of a named table (its initializer) score.
TABLES_CONFIG = """
data { train { name: "train" format: CSV } shuffle_buffer: 1000 }
features {
  preset: NO_PRESET
  field { name: "item" table: "item" }
  field { name: "history" table: "item" list { combiner: MEAN max_length: 6 %(attention)s } }
  field { name: "user" vocab_size: 100 }
  field { name: "cat" table: "cats" }
  table { name: "item" rows: 500 initializer { type: UNIFORM limit: 0.05 } }
  table { name: "cats" dim: %(cats_dim)d rows: 64 %(cats_join)s
          initializer { type: TRUNCATED_NORMAL stddev: 0.03 } }
}
model { type: %(model)s embedding_dim: 4 hidden: [ 16 ] }
sparse_optimizer { type: ADAGRAD learning_rate: 0.1 initial_accumulator: 0.0001 }
dense_optimizer { type: ADAM learning_rate: 0.003 }
train { batch_size: 64 epochs: 2 log_every_steps: 100000 }
threads { towers: 2 intra_op_threads: 1 inter_op_threads: 1 }
"""


def tables_csv(rows, seed, cats):
    """label,item,history,user,cat: the lists of list_csv, users u0..u59, cats c0..c{cats-1}."""
    rng = np.random.RandomState(seed)
    out = ["label,item,history,user,cat"]
    for _ in range(rows):
        topic, item = rng.randint(4), rng.randint(200)
        click = rng.rand() < (0.8 if item % 4 == topic else 0.2)
        hist = "|".join("i%d" % (4 * rng.randint(50) + topic) for _ in range(rng.randint(10)))
        out.append("%d,i%d,%s,u%d,c%d" % (click, item, hist, rng.randint(60), rng.randint(cats)))
    return "\n".join(out) + "\n"


def rewrite_block(path, index, edit):
    """Edits block `index` of a block file in place (edit(bytearray payload), same length) and
    writes its checksum again."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    off = 16
    for _ in range(index):
        off += 16 + struct.unpack_from("<Q", data, off + 8)[0] + 4
    end = off + 16 + struct.unpack_from("<Q", data, off + 8)[0]
    payload = bytearray(data[off + 16:end])
    edit(payload)
    data[off + 16:end] = payload
    struct.pack_into("<I", data, end, pc._masked(pc.crc32c(bytes(data[off:end]))))
    with open(path, "wb") as f:
        f.write(bytes(data))


class TablesReaderTest(unittest.TestCase):
    def train_predict_export(self, name, **config):
        """Trains TABLES_CONFIG % config; returns (model dir, export, test lines, predict's
        scores). The trained MANIFEST's row_dim is 1 + the largest dim (the stride)."""
        config.setdefault("attention", "")
        d = os.path.join(Fixture.dir, name)
        os.makedirs(d)
        paths = {}
        for fname, text in (("train.csv", tables_csv(3000, 1, 20)),
                            ("test.csv", tables_csv(400, 2, 40)),
                            ("config.textproto", TABLES_CONFIG % config)):
            paths[fname] = os.path.join(d, fname)
            with open(paths[fname], "w") as f:
                f.write(text)
        mdir, export = os.path.join(d, "m"), os.path.join(d, "export")
        run("train", "--config", paths["config.textproto"], "--train", paths["train.csv"],
            "--model_dir", mdir)
        with open(os.path.join(mdir, "LATEST")) as f:
            ckpt = os.path.join(mdir, f.read().strip())
        manifest = pc.parse_message(pc.read_blocks(os.path.join(ckpt, "MANIFEST"))[0][1],
                                    pc._MANIFEST)
        self.assertEqual(manifest["row_dim"], 1 + max(4, config["cats_dim"]))
        scores = os.path.join(d, "scores.tsv")
        run("predict", "--model_dir", mdir, "--input", paths["test.csv"], "--format", "csv",
            "--out", scores)
        run("export", "--model_dir", mdir, "--out", export, "--rows", "f32")
        with open(paths["test.csv"]) as f:
            lines = f.read().splitlines()[1:]
        return mdir, export, lines, np.loadtxt(scores, dtype=np.float64)[:, 0]

    def check_reader_and_serve(self, mdir, export, lines, want, widths):
        rows = [l.split(",")[1:] for l in lines]
        values = [[r[0], r[1], r[2], r[3]] for r in rows]
        for path in (export, mdir):
            m = pc.load(path)
            self.assertEqual([(t["name"], t["width"]) for t in m.tables], widths)
            self.assertEqual(m.fields[1]["offset"], m.fields[0]["offset"])  # one `item` table
            self.assertEqual(m.fields[1]["seed"], m.fields[0]["seed"])
            ids, scales = m.encode_values(values)
            probs = m.predict(ids, scales)
            np.testing.assert_allclose(probs, want, rtol=0, atol=1e-5, err_msg=path)
            self.assertGreater(float(np.std(probs)), 1e-2)
            # Rows of `cats` never trained are scored (their table's initializer, not zeros).
            cats = m.tables[-1]
            cat_rows = ids[:, 3, 0]
            untrained = [r for r in cat_rows if r not in set(m.ids.tolist())]
            self.assertGreater(len(untrained), 10)
            r = int(untrained[0])
            self.assertTrue(cats["begin"] <= r < cats["end"])
            init = m.lookup([r])[0]
            self.assertEqual(init[0], 0.0)
            self.assertTrue((init[1:cats["width"]] != 0).all())
            self.assertTrue((init[cats["width"]:] == 0).all())
            self.assertLessEqual(float(np.abs(init).max()), 2 * 0.03 + 1e-7)  # truncated at 2 sd
        import serve_client  # noqa: E402
        server = subprocess.Popen([BINARY, "serve", "--model", export, "--port", "0"],
                                  stdout=subprocess.PIPE, universal_newlines=True)
        try:
            line = server.stdout.readline()
            self.assertIn("listening on", line)
            client = serve_client.ServeClient(line.rsplit(" ", 1)[1].strip(), timeout=30)
            served, _ = client.predict_tsv(lines, have_label=True, csv=True)
            np.testing.assert_allclose(served, want, rtol=0, atol=1e-6)
            examples = [dict(zip(("item", "history", "user", "cat"), r)) for r in rows[:20]]
            one, _ = client.predict_examples(examples)
            np.testing.assert_allclose(one, want[:20], rtol=0, atol=1e-6)
        finally:
            server.send_signal(signal.SIGTERM)
            self.assertEqual(server.wait(timeout=60), 0)
            server.stdout.close()

    def test_tables_score_as_predict_and_serve(self):
        trained = self.train_predict_export("tables_reader", cats_dim=4, cats_join="", model="DEEPFM")
        self.assertIsNotNone(trained)
        self.check_reader_and_serve(*trained, widths=[("", 5), ("item", 5), ("cats", 5)])
        # What the reader refuses of a version-2 export (checksums made right, as a crafted file
        # would have them): a row block whose ids leave its first id's table, and a version-1
        # header whose description has tables.
        export = trained[1]
        version = os.listdir(export)[0]
        m = pc.load(export)
        for name, index, edit, says in (
                ("mixed", 3, lambda p: struct.pack_into("<q", p, 8, m.tables[1]["begin"] - 1),
                 "a block holds one table's rows"),
                ("v1", 0, lambda p: p.__setitem__(1, 1), "format version 1 cannot hold tables")):
            bad = os.path.join(Fixture.dir, "bad_tables_" + name, version)
            shutil.copytree(os.path.join(export, version), bad)
            rewrite_block(os.path.join(bad, "MODEL"), index, edit)
            with self.assertRaises(pc.FormatError) as e:
                pc.load(bad)
            self.assertIn(says, str(e.exception))

    def test_mixed_dims_score_as_predict_and_serve(self):
        # `cats` of dim 8 > k = 4, out of the FM term: the stride is 9 floats, and the rows of
        # the default table and of `item` are stored (and exported) at 5.
        trained = self.train_predict_export("tables_mixed", cats_dim=8,
                                            cats_join="fm_join: EXCLUDE", model="DEEPFM")
        self.check_reader_and_serve(*trained, widths=[("", 5), ("item", 5), ("cats", 9)])

    def test_din_at_a_narrower_dim_than_the_stride_scores_as_predict_and_serve(self):
        # DIN's history attends to the candidate through `item` (dim 4) while `cats` (dim 8)
        # makes the stride 9: the attention MLP reads [e, c, e - c, e * c] at the field's dim.
        trained = self.train_predict_export("tables_din", cats_dim=8, cats_join="", model="DIN",
                                            attention='attention_target: "item"')
        self.check_reader_and_serve(*trained, widths=[("", 5), ("item", 5), ("cats", 9)])


# Dynamic tables (docs/ARCHITECTURE.md "Dynamic tables"), trained in a 2-host PS job (the mode
# that carries them): `item` (ALWAYS admission, UNIFORM) shared by the candidate and the history,
# `cats` (COUNT admission: a key seen fewer than 3 times gets no row and reads zeros). The reader
# scores the version-3 export as `pstrain predict` does (cats never seen, items of the test only:
# keys without rows read the initializer or zeros, as in training), and `pstrain serve` too.
DYNAMIC_CONFIG = """
data { train { name: "train" format: CSV } eval { name: "eval" format: CSV } shuffle_buffer: 1000 }
features {
  preset: NO_PRESET
  field { name: "item" table: "item" }
  field { name: "history" table: "item" list { combiner: MEAN max_length: 6 } }
  field { name: "user" vocab_size: 100 }
  field { name: "cat" table: "cats" }
  table { name: "item" initializer { type: UNIFORM limit: 0.05 } dynamic { } }
  table { name: "cats" dim: 4 initializer { type: TRUNCATED_NORMAL stddev: 0.03 }
          dynamic { admission: COUNT admit_count: 3 sketch_width: 4096 sketch_depth: 2 } }
}
model { type: DEEPFM embedding_dim: 4 hidden: [ 16 ] }
sparse_optimizer { type: ADAGRAD learning_rate: 0.1 initial_accumulator: 0.0001 }
dense_optimizer { type: ADAM learning_rate: 0.003 }
train { batch_size: 64 epochs: 2 log_every_steps: 100000 }
threads { towers: 1 intra_op_threads: 1 inter_op_threads: 1 }
"""


class DynamicReaderTest(unittest.TestCase):
    def test_dynamic_tables_score_as_predict_and_serve(self):
        d = os.path.join(Fixture.dir, "dynamic")
        os.makedirs(d)
        paths = {}
        # Test cats reach 40 (training's stop at 20), and its items i2xx become i3xx: keys never
        # seen in training.
        for fname, text in (("a.csv", tables_csv(1500, 1, 20)), ("b.csv", tables_csv(1500, 3, 20)),
                            ("test.csv", tables_csv(400, 2, 40).replace(",i2", ",i3")),
                            ("config.textproto", DYNAMIC_CONFIG)):
            paths[fname] = os.path.join(d, fname)
            with open(paths[fname], "w") as f:
                f.write(text)
        mdir, export = os.path.join(d, "m"), os.path.join(d, "export")
        # Incremental checkpoints (a full one, then deltas): the checkpoint the reader loads
        # below is a delta, each link's rows in the DYNM groups of both shard files.
        run("local", "--hosts", "2", "--config", paths["config.textproto"], "--train",
            paths["a.csv"], "--train", paths["b.csv"], "--eval", paths["test.csv"], "--model_dir",
            mdir, "--set", "checkpoint.every_steps=20", "--set", "checkpoint.incremental_every=100",
            "--set", "checkpoint.keep=100")
        scores = os.path.join(d, "scores.tsv")
        run("predict", "--model_dir", mdir, "--input", paths["test.csv"], "--format", "csv",
            "--out", scores)
        want = np.loadtxt(scores, dtype=np.float64)[:, 0]
        run("export", "--model_dir", mdir, "--out", export, "--rows", "f32")
        with open(paths["test.csv"]) as f:
            lines = f.read().splitlines()[1:]
        rows = [l.split(",")[1:] for l in lines]
        m = pc.load(export)
        self.assertEqual([t["name"] for t in m.dynamic_tables], ["item", "cats"])
        self.assertEqual(m.tables[0]["name"], "")  # only the default table has a row range
        self.assertGreater(len(m.dynamic[0][0]), 150)  # the items' live rows
        ids, scales = m.encode_values([r[:4] for r in rows])
        self.assertTrue((ids[:, 0, 0] < 0).all())  # dynamic ids
        probs = m.predict(ids, scales)
        np.testing.assert_allclose(probs, want, rtol=0, atol=1e-5)
        self.assertGreater(float(np.std(probs)), 1e-2)
        # A cat key never admitted reads zeros; an item key never seen its initializer.
        unseen_cat = m._row_of_key(m.fields[3], m._categorical_key("c39"))
        self.assertTrue((m.lookup([unseen_cat])[0] == 0).all())
        unseen_item = m._row_of_key(m.fields[0], m._categorical_key("i999"))
        init = m.lookup([unseen_item])[0]
        self.assertEqual(init[0], 0.0)
        self.assertTrue((init[1:5] != 0).all())
        self.assertLessEqual(float(np.abs(init).max()), 0.05)
        # The PS checkpoint (2 shards, a delta chain) holds the export's live rows, and scores
        # as `pstrain predict` does.
        ck = pc.load(mdir)
        self.assertEqual(ck.step, m.step)
        with open(os.path.join(mdir, "LATEST")) as f:
            latest = os.path.join(mdir, f.read().strip())
        manifest = pc.parse_message(pc.read_blocks(os.path.join(latest, "MANIFEST"))[0][1],
                                    pc._MANIFEST)
        self.assertIn("delta", manifest)
        self.assertEqual(manifest["num_shards"], 2)
        for t in (0, 1):
            self.assertTrue(np.array_equal(ck.dynamic[t][0], m.dynamic[t][0]), t)
            self.assertTrue(np.array_equal(ck.dynamic[t][1], m.dynamic[t][1]), t)
        # Each shard holds a part of the keys (owned by their hash), none both.
        shard_keys = []
        for i in range(2):
            path = os.path.join(latest, "shard-%d-of-2" % i)
            blocks = pc.read_blocks(path)
            at = [j for j, (tag, _) in enumerate(blocks) if tag == "DYNM"]
            self.assertEqual(len(at), 2)  # a group per dynamic table
            snap, _ = pc.read_dynamic_group(path, blocks, at[0], os.path.getsize(path))
            self.assertEqual(snap.name, "item")
            self.assertGreater(snap.changed_since, 0)  # a delta
            shard_keys.append(set(snap.keys.tolist()))
        self.assertTrue(shard_keys[0] and shard_keys[1])
        self.assertFalse(shard_keys[0] & shard_keys[1])
        item = ck.dynamic_snapshots["item"]
        self.assertEqual(item.optimizer, 0)  # ADAGRAD: an accumulator per weight, positive
        self.assertEqual(item.state.shape, item.rows.shape)
        self.assertTrue((item.state > 0).all())
        self.assertTrue((item.counts >= 1).all())
        self.assertEqual(item.admitted, len(item.keys))  # ALWAYS, never evicted: summed shards
        self.assertEqual(ck.dynamic_snapshots["cats"].sketch.shape, (2, 4096))
        np.testing.assert_allclose(ck.predict(ids, scales), want, rtol=0, atol=1e-5)
        import serve_client  # noqa: E402
        server = subprocess.Popen([BINARY, "serve", "--model", export, "--port", "0"],
                                  stdout=subprocess.PIPE, universal_newlines=True)
        try:
            line = server.stdout.readline()
            self.assertIn("listening on", line)
            client = serve_client.ServeClient(line.rsplit(" ", 1)[1].strip(), timeout=30)
            served, _ = client.predict_tsv(lines, have_label=True, csv=True)
            np.testing.assert_allclose(served, want, rtol=0, atol=1e-6)
        finally:
            server.send_signal(signal.SIGTERM)
            self.assertEqual(server.wait(timeout=60), 0)
            server.stdout.close()

    def test_every_table_dynamic_scores_as_predict(self):
        # No fixed row at all (docs/CHECKPOINT.md "Every table dynamic"): a 2-host job's
        # checkpoint and export and `pstrain train`'s checkpoint say table_rows 0 and score as
        # `pstrain predict` does.
        d = os.path.join(Fixture.dir, "all_dynamic")
        os.makedirs(d)
        config = DYNAMIC_CONFIG.replace('field { name: "user" vocab_size: 100 }',
                                        'field { name: "user" table: "cats" }')
        self.assertNotEqual(config, DYNAMIC_CONFIG)
        paths = {}
        for fname, text in (("a.csv", tables_csv(1000, 1, 20)),
                            ("test.csv", tables_csv(300, 2, 20)), ("config.textproto", config)):
            paths[fname] = os.path.join(d, fname)
            with open(paths[fname], "w") as f:
                f.write(text)
        with open(paths["test.csv"]) as f:
            rows = [l.split(",")[1:] for l in f.read().splitlines()[1:]]
        common = ("--config", paths["config.textproto"], "--train", paths["a.csv"], "--eval",
                  paths["test.csv"])
        ps, train = os.path.join(d, "ps"), os.path.join(d, "train")
        run("local", "--hosts", "2", *common, "--model_dir", ps)
        run("train", *common, "--model_dir", train)
        for mdir in (ps, train):
            scores = os.path.join(mdir + "-scores.tsv")
            run("predict", "--model_dir", mdir, "--input", paths["test.csv"], "--format", "csv",
                "--out", scores)
            want = np.loadtxt(scores, dtype=np.float64)[:, 0]
            export = mdir + "-export"
            run("export", "--model_dir", mdir, "--out", export, "--rows", "f32")
            for m in (pc.load(mdir), pc.load(export)):
                self.assertEqual(m.table_rows, 0, mdir)
                self.assertEqual([t["name"] for t in m.dynamic_tables], ["item", "cats"])
                ids, scales = m.encode_values([r[:4] for r in rows])
                self.assertTrue((ids < 0).all())  # dynamic ids only
                probs = m.predict(ids, scales)
                np.testing.assert_allclose(probs, want, rtol=0, atol=1e-5)
                self.assertGreater(float(np.std(probs)), 1e-2)


# Dynamic tables in checkpoints (docs/CHECKPOINT.md "Dynamic tables"): the committed fixture,
# damage, and a `pstrain train` delta chain with TTL evictions (tombstones).
DYNAMIC_FIXTURE = os.path.join(SOURCE, "tests", "checkpoint", "testdata", "dynamic_v1.pstrn")


class DynamicCheckpointTest(unittest.TestCase):
    def test_the_fixture_reads_field_by_field(self):
        # The values of tests/ps/store/dynamic_file_test.cc DynamicFile.FixtureStillLoads: keys
        # 10..40 admitted (COUNT 2) at steps 1-2, a full snapshot; 10 and 50 updated at steps
        # 5-6, 60 seen once; a TTL of 3 steps evicts 20, 30 and 40; this delta holds the rest.
        s = pc.read_dynamic_file(DYNAMIC_FIXTURE)
        self.assertEqual((s.name, s.dim, s.optimizer, s.state_floats), ("user", 3, 0, 3))
        self.assertEqual((s.changed_since, s.pass_, s.last_step), (2, 2, 6))
        self.assertEqual(s.keys.dtype, np.uint64)
        self.assertEqual(s.keys.tolist(), [10, 50])
        self.assertEqual(s.counts.tolist(), [3, 1])
        self.assertEqual(s.last_pass.tolist(), [2, 2])
        self.assertEqual(s.last_step_of.tolist(), [6, 6])
        self.assertEqual(s.deleted.tolist(), [20, 30, 40])
        self.assertEqual((s.admitted, s.rejected, s.evicted_ttl, s.evicted_capacity, s.seen),
                         (5, 6, 3, 0, 13))
        # Rows start at (key % 100) + 0.25 j and move by small Adagrad steps.
        self.assertEqual(s.rows.shape, (2, 3))
        np.testing.assert_allclose(s.rows, [[10, 10.25, 10.5], [50, 50.25, 50.5]], atol=0.5)
        self.assertFalse(np.array_equal(s.rows, [[10, 10.25, 10.5], [50, 50.25, 50.5]]))
        self.assertEqual(s.state.shape, (2, 3))
        self.assertTrue((s.state > 0).all())  # Adagrad accumulators
        # The sketch counts each key without a row, once a depth row: 10..40 at steps 1 and 2,
        # 50 at step 5 and 6 (then admitted), 60 at step 6: 11 in each of its 2 rows.
        self.assertEqual(s.sketch.shape, (2, 1024))
        self.assertEqual(s.sketch.sum(axis=1).tolist(), [11, 11])

    def damaged(self, name, edit):
        """The fixture, edited (edit(bytearray) -> bytes), as a file of a temporary dir."""
        d = os.path.join(Fixture.dir, "dynamic_damage")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, name)
        with open(DYNAMIC_FIXTURE, "rb") as f:
            data = bytearray(f.read())
        with open(path, "wb") as f:
            f.write(bytes(edit(data)))
        return path

    def test_damage_is_refused_naming_the_file(self):
        size = os.path.getsize(DYNAMIC_FIXTURE)

        def flip(data):
            data[200] ^= 0x10
            return data

        def magic(data):
            data[0:8] = b"PSTRNXXX"
            return data

        cases = [("truncated", lambda d: d[:size - 30], "truncated"),
                 ("crc", flip, "checksum mismatch"),
                 ("magic", magic, "bad magic"),
                 ("cut_in_header", lambda d: d[:40], "truncated")]
        for name, edit, says in cases:
            with self.subTest(damage=name):
                path = self.damaged(name, edit)
                with self.assertRaises(ValueError) as e:
                    pc.read_dynamic_file(path)
                self.assertIn(path, str(e.exception))
                self.assertIn(says, str(e.exception))
        # Well-framed (checksums made right) but lying: counts the file cannot hold are refused
        # before anything is allocated for them; a count that does not match the blocks; keys
        # out of order; an unknown layout version.
        lies = [("rows", lambda p: struct.pack_into("<Q", p, 32, 1 << 40), "can hold"),
                ("sketch", lambda p: struct.pack_into("<QI", p, 48, 1 << 32, 16), "can hold"),
                ("tombstones", lambda p: struct.pack_into("<Q", p, 40, 4),
                 "3 tombstones and 2048 sketch counters; its meta (block 0) says 2, 4 and 2048"),
                ("version", lambda p: struct.pack_into("<I", p, 0, 2), "layout version 2")]
        for name, edit, says in lies:
            with self.subTest(lie=name):
                path = self.damaged("lie_" + name, lambda d: d)
                rewrite_block(path, 0, edit)
                with self.assertRaises(pc.FormatError) as e:
                    pc.read_dynamic_file(path)
                self.assertIn(path, str(e.exception))
                self.assertIn(says, str(e.exception))
        path = self.damaged("unsorted", lambda d: d)
        rewrite_block(path, 1, lambda p: struct.pack_into("<QQ", p, 8, 50, 10))
        with self.assertRaises(pc.FormatError) as e:
            pc.read_dynamic_file(path)
        self.assertIn("keys not ascending", str(e.exception))

    def test_a_train_delta_chain_with_evictions_reads_as_its_full_twin_and_the_export(self):
        d = os.path.join(Fixture.dir, "dynamic_train")
        os.makedirs(d)
        # Items i* in the first half, j* in the second: with a TTL of 6 steps, rows go while
        # the other half trains, and come back in the second epoch.
        data = tables_csv(1500, 1, 20) + tables_csv(1500, 3, 20).split("\n", 1)[1].replace("i", "j")
        config = DYNAMIC_CONFIG.replace(' eval { name: "eval" format: CSV }', "").replace(
            "dynamic { } }", "dynamic { ttl_steps: 6 } }")
        self.assertEqual(config.count("ttl_steps"), 1)
        paths = {}
        for name, text in (("train.csv", data), ("config.textproto", config),
                           ("test.csv", tables_csv(200, 2, 30))):
            paths[name] = os.path.join(d, name)
            with open(paths[name], "w") as f:
                f.write(text)
        every = ["--set", "checkpoint.every_steps=10", "--set", "checkpoint.keep=100"]
        chain, full = os.path.join(d, "chain"), os.path.join(d, "full")
        for mdir, extra in ((chain, ["--set", "checkpoint.incremental_every=100"]), (full, [])):
            run("train", "--config", paths["config.textproto"], "--train", paths["train.csv"],
                "--model_dir", mdir, *(every + extra))
        run("export", "--model_dir", chain, "--out", os.path.join(d, "export"), "--rows", "f32")
        c, f, e = pc.load(chain), pc.load(full), pc.load(os.path.join(d, "export"))
        self.assertEqual(c.step, f.step)
        self.assertEqual(sorted(c.dynamic_snapshots), ["cats", "item"])
        # Full + 9 deltas equal the full checkpoint of the same step, field by field.
        for name in ("item", "cats"):
            a, b = c.dynamic_snapshots[name], f.dynamic_snapshots[name]
            self.assertGreater(a.changed_since, 0)
            self.assertEqual(b.changed_since, 0)
            for attr in ("keys", "rows", "state", "counts", "last_pass", "last_step_of"):
                self.assertTrue(np.array_equal(getattr(a, attr), getattr(b, attr)), (name, attr))
            self.assertEqual(a.counters(), b.counters())
            self.assertEqual(len(a.deleted), 0)
        self.assertTrue(np.array_equal(c.dynamic_snapshots["cats"].sketch,
                                       f.dynamic_snapshots["cats"].sketch))
        # The keys are the stores' keys: the low 55 bits of the raw id's hash with the table's
        # seed; the 20 cats of the data (each seen far more than admit_count 3 times) are there.
        cats = c.dynamic_snapshots["cats"]
        want_keys = sorted(c._row_of_key(c.fields[3], c._categorical_key("c%d" % i)) &
                           ((1 << 55) - 1) for i in range(20))
        self.assertEqual(cats.keys.tolist(), want_keys)
        item = c.dynamic_snapshots["item"]
        self.assertGreater(item.evicted_ttl, 50)
        self.assertEqual(item.admitted - item.evicted_ttl, len(item.keys))
        # And the export's live rows (m.dynamic by dynamic index: item 0, cats 1).
        for t in (0, 1):
            self.assertTrue(np.array_equal(c.dynamic[t][0], e.dynamic[t][0]), t)
            self.assertTrue(np.array_equal(c.dynamic[t][1], e.dynamic[t][1]), t)
        # The tombstones are what the chain needs: a delta's evicted keys (those not back in the
        # same delta) are not in its result, and most were in its parent's (the others came and
        # went between the two checkpoints).
        evicting, removed = 0, 0
        # Each link's result (verified above: load(chain) checked every link's checksums).
        steps = sorted(int(n[5:]) for n in os.listdir(chain) if n.startswith("ckpt-"))
        self.assertEqual(steps, list(range(10, 100, 10)) + [c.step])
        items = {step: pc.load(os.path.join(chain, "ckpt-%d" % step),
                               verify=False).dynamic_snapshots["item"].keys
                 for step in steps[:-1]}
        items[c.step] = item.keys
        for parent, step in zip(steps, steps[1:]):
            link = pc.read_dynamic_file(os.path.join(chain, "ckpt-%d" % step, "dynamic-item"))
            gone = np.setdiff1d(link.deleted, link.keys)
            if len(gone) == 0:
                continue
            evicting += 1
            removed += int(np.isin(gone, items[parent]).sum())
            self.assertFalse(np.isin(gone, items[step]).any(), step)
        self.assertGreaterEqual(evicting, 5)
        self.assertGreater(removed, 100)
        # The chain's model scores as `pstrain predict` does (its dynamic rows read as an
        # export's: keys without a row read the initializer or zeros).
        scores = os.path.join(d, "scores.tsv")
        run("predict", "--model_dir", chain, "--input", paths["test.csv"], "--format", "csv",
            "--out", scores)
        want = np.loadtxt(scores, dtype=np.float64)[:, 0]
        with open(paths["test.csv"]) as fh:
            rows = [l.split(",")[1:5] for l in fh.read().splitlines()[1:]]
        ids, scales = c.encode_values(rows)
        np.testing.assert_allclose(c.predict(ids, scales), want, rtol=0, atol=1e-5)
        # A link's file missing breaks the chain, naming it.
        broken = os.path.join(d, "broken")
        shutil.copytree(chain, broken)
        os.remove(os.path.join(broken, "ckpt-50", "dynamic-cats"))
        with self.assertRaises(ValueError) as err:
            pc.load(broken)
        self.assertIn(os.path.join(broken, "ckpt-50", "dynamic-cats"), str(err.exception))


# DIN's target attention (docs/CONFIG.md "DIN"): `history` is pooled by an attention MLP against
# `item`, as DIN (no FM term) and as DeepFM's blocks with the attended history (BLOCKS FM_TERM,
# whose FM sums take the attended vector). The reader scores the export and the checkpoint as
# `pstrain predict` does, and `pstrain serve` scores the CSV rows alike.
DIN_MODELS = {
    "din": "model { type: DIN embedding_dim: 4 hidden: [ 16 ] }",
    "fm_attention": "model { type: BLOCKS embedding_dim: 4 hidden: [ 16 ] "
                    "blocks { interaction: FM_TERM } }",
}


class DinReaderTest(unittest.TestCase):
    def test_attention_scores_as_predict_and_serve(self):
        d = os.path.join(Fixture.dir, "din")
        os.makedirs(d)
        paths = {}
        for name, text in (("train.csv", list_csv(3000, 1)), ("test.csv", list_csv(400, 2))):
            paths[name] = os.path.join(d, name)
            with open(paths[name], "w") as f:
                f.write(text)
        with open(paths["test.csv"]) as f:
            lines = f.read().splitlines()[1:]
        rows = [l.split(",")[1:] for l in lines]
        values = [[c or None for c in r[:1]] + r[1:3] + [float(r[3])] for r in rows]
        # attention_hidden [8, 4]: two layers, so the reader's loop over them is exercised.
        config = LIST_CONFIG.replace(
            'list { combiner: MEAN max_length: 6 }',
            'list { combiner: MEAN max_length: 6 attention_target: "item" '
            'attention_hidden: [ 8, 4 ] }')
        self.assertNotEqual(config, LIST_CONFIG)
        import serve_client  # noqa: E402
        for name, model in DIN_MODELS.items():
            with self.subTest(model=name):
                path = os.path.join(d, name + ".textproto")
                with open(path, "w") as f:
                    f.write(config.replace("model { type: DEEPFM embedding_dim: 4 hidden: [ 16 ] }",
                                           model))
                mdir, export = os.path.join(d, name), os.path.join(d, name + "_export")
                run("train", "--config", path, "--train", paths["train.csv"], "--model_dir", mdir)
                scores = os.path.join(d, name + "_scores.tsv")
                run("predict", "--model_dir", mdir, "--input", paths["test.csv"], "--format",
                    "csv", "--out", scores)
                want = np.loadtxt(scores, dtype=np.float64)[:, 0]
                run("export", "--model_dir", mdir, "--out", export, "--rows", "f32")
                for where in (export, mdir):
                    m = pc.load(where)
                    self.assertEqual(m.attention, [(1, 0, [8, 4])])
                    self.assertEqual(m.tensors["att1/mlp0/w"].shape, (16, 8))
                    self.assertEqual(m.tensors["att1/out/w"].shape, (4, 1))
                    ids, scales = m.encode_values(values)
                    probs = m.predict(ids, scales)
                    np.testing.assert_allclose(probs, want, rtol=0, atol=1e-5, err_msg=where)
                    self.assertGreater(float(np.std(probs)), 1e-2)
                # The attention matters: pooling the history by its combiner instead scores
                # otherwise (so the match above is not the attention ignored on both sides).
                plain = pc.load(export)
                plain.attention = []
                self.assertGreater(float(np.abs(plain.predict(ids, scales) - want).max()), 1e-3)
                server = subprocess.Popen([BINARY, "serve", "--model", export, "--port", "0"],
                                          stdout=subprocess.PIPE, universal_newlines=True)
                try:
                    line = server.stdout.readline()
                    self.assertIn("listening on", line)
                    client = serve_client.ServeClient(line.rsplit(" ", 1)[1].strip(), timeout=30)
                    served, _ = client.predict_tsv(lines, have_label=True, csv=True)
                    np.testing.assert_allclose(served, want, rtol=0, atol=1e-6)
                finally:
                    server.send_signal(signal.SIGTERM)
                    self.assertEqual(server.wait(timeout=60), 0)
                    server.stdout.close()
        # A target that is not a single-valued CATEGORICAL field is refused, naming the field.
        bad = {"features": {"preset": 0, "field": [
            {"name": "a", "vocab_size": 10, "list": {"attention_target": "b"}},
            {"name": "b", "vocab_size": 10, "list": {}}]},
            "model": {"type": pc.DIN, "embedding_dim": 4}}
        with self.assertRaises(pc.FormatError) as err:
            pc.Model("x", bad, np.zeros(0, np.int64), np.zeros((0, 5), np.float32),
                     np.zeros(1, np.float32), 5, 20)
        self.assertIn("field 'a' list.attention_target 'b'", str(err.exception))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
