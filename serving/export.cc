#include "serving/export.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "common/file.h"
#include "common/logging.h"
#include "common/status.h"

namespace pstrain {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the export is little-endian");

template <typename T>
void Append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

uint16_t ToBfloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // stays a NaN
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}

float FromBfloat16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A decimal version name as WriteExport writes it: digits only, no leading zero (but "0").
bool ParseVersion(absl::string_view s, int64_t* v) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(s, v);
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return ErrnoError("open", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : ErrnoError("fsync", dir);
}

}  // namespace

absl::StatusOr<RowEncoding> ParseRowEncoding(absl::string_view name) {
  if (name == "f32") return RowEncoding::kFloat32;
  if (name == "bf16") return RowEncoding::kBfloat16;
  if (name == "int8") return RowEncoding::kInt8;
  return absl::InvalidArgumentError(
      absl::StrCat("row encoding '", name, "': expected f32, bf16 or int8"));
}

const char* RowEncodingName(RowEncoding encoding) {
  switch (encoding) {
    case RowEncoding::kFloat32: return "f32";
    case RowEncoding::kBfloat16: return "bf16";
    case RowEncoding::kInt8: return "int8";
  }
  return "?";
}

int64_t EncodedRowBytes(RowEncoding encoding, int row_dim) {
  switch (encoding) {
    case RowEncoding::kFloat32: return 4 * int64_t{row_dim};
    case RowEncoding::kBfloat16: return 2 * int64_t{row_dim};
    case RowEncoding::kInt8: return 8 + int64_t{row_dim} - 1;
  }
  return 0;
}

void EncodeRows(RowEncoding encoding, int row_dim, int64_t n, const float* rows, std::string* out) {
  out->reserve(out->size() + n * EncodedRowBytes(encoding, row_dim));
  for (int64_t r = 0; r < n; ++r) {
    const float* row = rows + r * row_dim;
    switch (encoding) {
      case RowEncoding::kFloat32:
        out->append(reinterpret_cast<const char*>(row), 4 * row_dim);
        break;
      case RowEncoding::kBfloat16:
        for (int j = 0; j < row_dim; ++j) Append(out, ToBfloat16(row[j]));
        break;
      case RowEncoding::kInt8: {
        float max_abs = 0.f;
        for (int j = 1; j < row_dim; ++j) max_abs = std::max(max_abs, std::fabs(row[j]));
        const float scale = max_abs / 127.f;
        Append(out, row[0]);
        Append(out, scale);
        for (int j = 1; j < row_dim; ++j) {
          const float q = scale > 0.f ? std::nearbyint(row[j] / scale) : 0.f;
          Append(out, static_cast<int8_t>(std::clamp(q, -127.f, 127.f)));
        }
        break;
      }
    }
  }
}

void DecodeRows(RowEncoding encoding, int row_dim, int64_t n, const char* data, float* rows) {
  for (int64_t r = 0; r < n; ++r) {
    float* row = rows + r * row_dim;
    switch (encoding) {
      case RowEncoding::kFloat32:
        std::memcpy(row, data, 4 * row_dim);
        data += 4 * row_dim;
        break;
      case RowEncoding::kBfloat16:
        for (int j = 0; j < row_dim; ++j, data += 2) row[j] = FromBfloat16(Load<uint16_t>(data));
        break;
      case RowEncoding::kInt8: {
        row[0] = Load<float>(data);
        const float scale = Load<float>(data + 4);
        data += 8;
        for (int j = 1; j < row_dim; ++j, ++data) {
          row[j] = static_cast<float>(static_cast<int8_t>(*data)) * scale;
        }
        break;
      }
    }
  }
}

absl::StatusOr<ExportInfo> WriteExport(const ServingModel& model, const std::string& base,
                                       const ExportOptions& options) {
  ExportInfo info;
  info.version = options.version >= 0 ? options.version : model.origin().step;
  info.dir = absl::StrCat(base, "/", info.version);
  info.rows = model.stored_rows();
  if (PathExists(info.dir)) {
    return absl::AlreadyExistsError(absl::StrCat(
        info.dir, " exists: an export version is never overwritten (pass another --version)"));
  }
  RETURN_IF_ERROR(MakeDirs(base));
  // A predictable name: a symlink planted there is replaced, never written through.
  const std::string staging = absl::StrCat(base, "/.tmp-", info.version, ".", getpid());
  RETURN_IF_ERROR(MakeOwnDir(staging));

  ExportHeader header;
  // Format version 1 when the config names no table (such an export is byte for byte what
  // pstrain wrote before tables existed, so older readers keep reading it); 2 with tables, whose
  // rows are stored at their table's width (a reader of version 1 would misread them).
  header.set_format_version(model.spec().has_dynamic_tables() ? 3
                            : model.spec().has_named_tables() ? 2
                                                              : 1);
  if (model.spec().has_dynamic_tables()) header.set_dynamic_rows(model.dynamic_rows());
  *header.mutable_model() = model.description();
  header.set_row_encoding(static_cast<int>(options.encoding));
  header.set_table_rows(model.table_rows());
  header.set_row_dim(model.row_dim());
  header.set_rows(info.rows);
  header.set_dense_size(model.dense_size());
  for (const DenseTensor& t : model.model().dense_layout()) {
    ExportHeader::Tensor* out = header.add_dense_tensor();
    out->set_name(t.name);
    out->set_offset(t.offset);
    for (int64_t d : t.shape) out->add_shape(d);
  }
  header.set_source_checkpoint(model.origin().path);
  header.set_step(model.origin().step);
  header.set_version(info.version);
  header.set_created_by(options.created_by);
  header.set_wall_time(options.env->WallSeconds());

  const std::string file = staging + "/" + kExportFileName;
  auto write = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto w, BlockWriter::Create(file));
    RETURN_IF_ERROR(w->Add(kExportHeaderTag, header.SerializeAsString()));
    const std::vector<float>& dense = model.dense();
    RETURN_IF_ERROR(w->Add(kExportDenseTag,
                           absl::string_view(reinterpret_cast<const char*>(dense.data()),
                                             dense.size() * sizeof(float))));
    int64_t written = 0;
    std::string payload;
    // Table by table (a block holds one table's rows, at its width), each streamed range by
    // range: memory stays one range's rows. Without named tables: one table, the whole row space
    // at row_dim, the layout of format version 1.
    constexpr int64_t kRange = int64_t{1} << 20;
    for (int t = 0; t < static_cast<int>(model.row_tables().size()); ++t) {
      const ServingModel::RowTable& rt = model.row_tables()[t];
      const int dim = rt.width;
      for (int64_t from = rt.begin; from < rt.end; from += kRange) {
        const EmbeddingSnapshot snap =
            model.StoredTableRows(t, from, std::min(rt.end, from + kRange));
        for (int64_t b = 0; b < snap.rows(); b += kExportRowsPerBlock) {
          const int64_t n = std::min<int64_t>(kExportRowsPerBlock, snap.rows() - b);
          payload.clear();
          Append(&payload, static_cast<uint32_t>(n));
          Append(&payload, static_cast<uint32_t>(options.encoding));
          payload.append(reinterpret_cast<const char*>(snap.ids.data() + b), 8 * n);
          EncodeRows(options.encoding, dim, n, snap.weights.data() + b * dim, &payload);
          RETURN_IF_ERROR(w->Add(kExportRowsTag, payload));
          written += n;
        }
      }
    }
    if (written != info.rows) {
      return absl::InternalError(absl::StrCat("export: ", written, " rows written, ", info.rows,
                                              " counted: the model changed while exported"));
    }
    // The dynamic tables' live rows, table by table (a snapshot of one table's live rows at a
    // time: memory stays that table's rows).
    int64_t dynamic_written = 0;
    for (int d = 0; d < static_cast<int>(model.dynamic_stores().size()); ++d) {
      ASSIGN_OR_RETURN(const DynamicSnapshot snap, model.dynamic_stores()[d]->Snapshot());
      const int width = snap.dim;
      for (int64_t b = 0; b < snap.rows(); b += kExportRowsPerBlock) {
        const int64_t n = std::min<int64_t>(kExportRowsPerBlock, snap.rows() - b);
        payload.clear();
        Append(&payload, static_cast<uint32_t>(n));
        Append(&payload, static_cast<uint32_t>(options.encoding));
        Append(&payload, static_cast<uint32_t>(d));
        Append(&payload, uint32_t{0});
        payload.append(reinterpret_cast<const char*>(snap.keys.data() + b), 8 * n);
        EncodeRows(options.encoding, width, n, snap.weights.data() + b * width, &payload);
        RETURN_IF_ERROR(w->Add(kExportDynamicTag, payload));
        dynamic_written += n;
      }
    }
    if (dynamic_written != header.dynamic_rows()) {
      return absl::InternalError(absl::StrCat("export: ", dynamic_written, " dynamic rows "
                                              "written, ", header.dynamic_rows(), " counted"));
    }
    RETURN_IF_ERROR(w->Finish());
    info.bytes = w->bytes();
    return absl::OkStatus();
  };
  absl::Status s = write();
  if (s.ok() && std::rename(staging.c_str(), info.dir.c_str()) != 0) {
    s = ErrnoError("rename " + staging + " to", info.dir);
  }
  if (!s.ok()) {
    std::remove(file.c_str());
    ::rmdir(staging.c_str());
    return s;
  }
  RETURN_IF_ERROR(SyncDir(base));
  return info;
}

absl::StatusOr<std::unique_ptr<ServingModel>> ReadExport(const std::string& dir,
                                                         const ReadExportOptions& options) {
  const std::string path = dir + "/" + kExportFileName;
  // BlockReader opens it with OpenRegularFile: a FIFO or a device is refused, never waited on.
  ASSIGN_OR_RETURN(auto r, BlockReader::Open(path));
  auto cancelled = [&] {
    return options.cancel != nullptr && options.cancel->HasBeenNotified();
  };
  const auto stopped = [&] {
    return absl::CancelledError(absl::StrCat(path, ": reading stopped (the reader is stopping)"));
  };
  Block b;
  ASSIGN_OR_RETURN(bool got, r->Next(&b));
  ExportHeader header;
  if (!got || b.tag != kExportHeaderTag) {
    return absl::DataLossError(absl::StrCat(path, ": expected a '", kExportHeaderTag,
                                            "' block first: not a pstrain export"));
  }
  if (!header.ParseFromString(b.payload)) {
    return r->Corrupt(b, "payload is not a valid pstrain.ExportHeader");
  }
  if (header.format_version() < 1 || header.format_version() > kExportFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": export format version ", header.format_version(),
                     ", this pstrain reads 1..", kExportFormatVersion));
  }
  if (header.row_encoding() < 0 || header.row_encoding() > 2) {
    return r->Corrupt(b, absl::StrCat("unknown row encoding ", header.row_encoding()));
  }
  const RowEncoding encoding = static_cast<RowEncoding>(header.row_encoding());
  // Every size the header claims is checked before anything is allocated: the model's shape
  // within the served model's limits (ServingModel::ShapeOf allocates no parameter), the header's
  // sizes against that shape, and what its blocks must hold against the file's size.
  absl::StatusOr<ServingModel::Shape> shape = ServingModel::ShapeOf(header.model());
  if (!shape.ok()) return Annotate(shape.status(), path + ": the model description");
  if (header.table_rows() != shape->table_rows || header.row_dim() != shape->row_dim ||
      header.dense_size() != shape->dense_size) {
    return r->Corrupt(b, absl::StrCat("header says rows ", header.table_rows(), " x ",
                                      header.row_dim(), ", dense ", header.dense_size(),
                                      "; its model description makes ", shape->table_rows, " x ",
                                      shape->row_dim, ", dense ", shape->dense_size));
  }
  if (header.format_version() < 2 && header.model().features().table_size() > 0) {
    return r->Corrupt(b, absl::StrCat("format version ", header.format_version(),
                                      " cannot hold tables (features.table), version 2 does"));
  }
  const bool has_dynamic =
      std::any_of(header.model().features().table().begin(),
                  header.model().features().table().end(),
                  [](const TableConfig& t) { return t.has_dynamic(); });
  if (header.format_version() < 3 && (has_dynamic || header.dynamic_rows() != 0)) {
    return r->Corrupt(b, absl::StrCat("format version ", header.format_version(),
                                      " cannot hold dynamic tables, version 3 does"));
  }
  {
    const uint64_t file_bytes = r->size();
    const uint64_t dense_bytes = static_cast<uint64_t>(shape->dense_size) * sizeof(float);
    // id + values, of the narrowest table (every row is at least that)
    int narrowest = shape->row_dim;
    for (const ServingModel::RowTable& t : shape->row_tables) {
      narrowest = std::min(narrowest, t.width);
    }
    const uint64_t row_bytes = 8 + EncodedRowBytes(encoding, narrowest);
    if (dense_bytes > file_bytes) {
      return r->Corrupt(b, absl::StrCat("header field dense_size ", header.dense_size(), " (",
                                        dense_bytes, " bytes of float32) is more than the file's ",
                                        file_bytes, " bytes"));
    }
    if (header.rows() < 0 ||
        static_cast<uint64_t>(header.rows()) > (file_bytes - dense_bytes) / row_bytes) {
      return r->Corrupt(b, absl::StrCat("header field rows ", header.rows(), " (", row_bytes,
                                        " bytes each) does not fit in the file's ", file_bytes,
                                        " bytes"));
    }
    // A dynamic row is at least a key and one float (a width-1 row).
    const uint64_t dynamic_row_bytes = 8 + EncodedRowBytes(encoding, 1);
    if (header.dynamic_rows() < 0 ||
        static_cast<uint64_t>(header.dynamic_rows()) > file_bytes / dynamic_row_bytes) {
      return r->Corrupt(b, absl::StrCat("header field dynamic_rows ", header.dynamic_rows(),
                                        " does not fit in the file's ", file_bytes, " bytes"));
    }
  }
  ServingModel::Origin origin{dir, header.step(), header.version()};
  absl::StatusOr<std::unique_ptr<ServingModel>> created =
      ServingModel::Create(header.model(), std::move(origin));
  if (!created.ok()) return Annotate(created.status(), path + ": the model description");
  std::unique_ptr<ServingModel> m = *std::move(created);

  if (cancelled()) return stopped();
  ASSIGN_OR_RETURN(got, r->Next(&b));
  if (!got || b.tag != kExportDenseTag) {
    return absl::DataLossError(absl::StrCat(path, ": expected the '", kExportDenseTag,
                                            "' block after the header"));
  }
  if (b.payload.size() != static_cast<size_t>(m->dense_size()) * sizeof(float)) {
    return r->Corrupt(b, absl::StrCat(b.payload.size(), " bytes, expected ", m->dense_size(),
                                      " float32"));
  }
  std::memcpy(m->mutable_dense()->data(), b.payload.data(), b.payload.size());

  int64_t rows = 0, last_id = -1, dynamic_rows = 0;
  int last_table = -1;
  uint64_t last_key = 0;
  std::vector<float> decoded;
  std::vector<int64_t> ids;
  std::vector<uint64_t> keys;
  while (true) {
    if (cancelled()) return stopped();
    ASSIGN_OR_RETURN(got, r->Next(&b));
    if (!got) break;
    if (b.tag == kExportDynamicTag && header.format_version() >= 3) {
      if (b.payload.size() < 16) return r->Corrupt(b, "shorter than its 16-byte header");
      const int64_t n = Load<uint32_t>(b.payload.data());
      const uint32_t enc = Load<uint32_t>(b.payload.data() + 4);
      const uint32_t table = Load<uint32_t>(b.payload.data() + 8);
      if (enc != static_cast<uint32_t>(encoding)) {
        return r->Corrupt(b, absl::StrCat("row encoding ", enc, ", the header says ",
                                          static_cast<int>(encoding)));
      }
      if (table >= m->dynamic_stores().size()) {
        return r->Corrupt(b, absl::StrCat("dynamic table ", table, ", the model has ",
                                          m->dynamic_stores().size()));
      }
      const int width = m->dynamic_stores()[table]->dim();
      const int64_t row_bytes = EncodedRowBytes(encoding, width);
      if (n == 0 || n > kExportRowsPerBlock ||
          b.payload.size() != static_cast<size_t>(16 + n * (8 + row_bytes))) {
        return r->Corrupt(b, absl::StrCat(b.payload.size(), " bytes for ", n,
                                          " dynamic rows of ", row_bytes, " bytes (at most ",
                                          kExportRowsPerBlock, " rows a block)"));
      }
      keys.resize(n);
      std::memcpy(keys.data(), b.payload.data() + 16, 8 * n);
      for (uint64_t key : keys) {
        if (static_cast<int>(table) < last_table ||
            (static_cast<int>(table) == last_table && key <= last_key)) {
          return r->Corrupt(b, absl::StrCat("dynamic table ", table, " key ", key, " after table ",
                                            last_table, " key ", last_key,
                                            ": expected (table, key) ascending"));
        }
        last_table = static_cast<int>(table);
        last_key = key;
      }
      decoded.resize(n * width);
      DecodeRows(encoding, width, n, b.payload.data() + 16 + 8 * n, decoded.data());
      RETURN_IF_ERROR(Annotate(m->StoreDynamicRows(static_cast<int>(table), keys,
                                                   decoded.data()),
                               path));
      dynamic_rows += n;
      continue;
    }
    if (b.tag != kExportRowsTag) continue;  // a block kind this reader does not know
    if (b.payload.size() < 8) return r->Corrupt(b, "shorter than its 8-byte header");
    const int64_t n = Load<uint32_t>(b.payload.data());
    const uint32_t enc = Load<uint32_t>(b.payload.data() + 4);
    if (enc != static_cast<uint32_t>(encoding)) {
      return r->Corrupt(b, absl::StrCat("row encoding ", enc, ", the header says ",
                                        static_cast<int>(encoding)));
    }
    // The block's table is its first id's (a block holds one table's rows, at its width).
    int table = 0;
    if (n > 0 && b.payload.size() >= 16) {
      table = std::max(0, m->RowTableOf(Load<int64_t>(b.payload.data() + 8)));
    }
    const ServingModel::RowTable& rt = m->row_tables()[table];
    const int dim = rt.width;
    const int64_t row_bytes = EncodedRowBytes(encoding, dim);
    if (n == 0 || n > kExportRowsPerBlock ||
        b.payload.size() != static_cast<size_t>(8 + n * (8 + row_bytes))) {
      return r->Corrupt(b, absl::StrCat(b.payload.size(), " bytes for ", n, " rows of ",
                                        row_bytes, " bytes (at most ", kExportRowsPerBlock,
                                        " rows a block)"));
    }
    ids.resize(n);
    std::memcpy(ids.data(), b.payload.data() + 8, 8 * n);
    for (int64_t id : ids) {
      if (id <= last_id || id >= m->table_rows()) {
        return r->Corrupt(b, absl::StrCat("row id ", id, " after ", last_id,
                                          ": expected ascending ids in [0, ", m->table_rows(),
                                          ")"));
      }
      if (id >= rt.end) {
        return r->Corrupt(b, absl::StrCat("row id ", id, " is past table '", rt.name, "' [",
                                          rt.begin, ", ", rt.end, ") of the block's first id: a "
                                          "block holds one table's rows"));
      }
      last_id = id;
    }
    decoded.resize(n * dim);
    DecodeRows(encoding, dim, n, b.payload.data() + 8 + 8 * n, decoded.data());
    RETURN_IF_ERROR(m->StoreTableRows(table, ids, decoded.data()));
    rows += n;
  }
  if (rows != header.rows()) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", rows, " rows in its blocks, the header says ", header.rows()));
  }
  if (dynamic_rows != header.dynamic_rows()) {
    return absl::DataLossError(absl::StrCat(path, ": ", dynamic_rows,
                                            " dynamic rows in its blocks, the header says ",
                                            header.dynamic_rows()));
  }
  return m;
}

std::vector<int64_t> ListExportVersions(const std::string& base) {
  std::vector<int64_t> out;
  DIR* d = opendir(base.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    int64_t v;
    if (!ParseVersion(e->d_name, &v)) continue;
    if (PathExists(absl::StrCat(base, "/", e->d_name, "/", kExportFileName))) out.push_back(v);
  }
  closedir(d);
  std::sort(out.rbegin(), out.rend());
  return out;
}

absl::StatusOr<std::string> ResolveExportDir(const std::string& path, Env* env) {
  if (PathExists(path + "/" + kExportFileName)) return path;
  const std::vector<int64_t> versions = ListExportVersions(path);
  if (versions.empty()) {
    return absl::NotFoundError(absl::StrCat(
        path, env->IsDirectory(path) ? " holds no export: neither a MODEL file nor a version "
                                       "directory (<number>/MODEL)"
                                     : " does not exist"));
  }
  return absl::StrCat(path, "/", versions.front());
}

absl::StatusOr<std::unique_ptr<ServingModel>> ReadNewestExport(const std::string& base,
                                                               int64_t newer_than,
                                                               const ReadExportOptions& options,
                                                               const ExportReader& read) {
  constexpr int kMaxNamed = 4;  // versions named in the error when none reads
  absl::Status first;
  std::string tried;
  int failed = 0;
  for (int64_t v : ListExportVersions(base)) {
    if (v <= newer_than) break;  // newest first
    if (options.cancel != nullptr && options.cancel->HasBeenNotified()) {
      return absl::CancelledError(absl::StrCat("loading ", base, ": stopped"));
    }
    const std::string dir = absl::StrCat(base, "/", v);
    absl::StatusOr<std::unique_ptr<ServingModel>> m = read ? read(dir, options)
                                                           : ReadExport(dir, options);
    if (m.ok()) return m;
    if (absl::IsCancelled(m.status())) return m.status();
    PSTRAIN_LOG(ERROR) << "skipping export version " << dir << ": " << m.status().message();
    if (failed == 0) first = m.status();
    if (failed < kMaxNamed) absl::StrAppend(&tried, failed > 0 ? "; " : "", m.status().message());
    ++failed;
  }
  if (failed == 0) return std::unique_ptr<ServingModel>();
  if (failed > kMaxNamed) absl::StrAppend(&tried, "; and ", failed - kMaxNamed, " more");
  return absl::Status(first.code(),
                      absl::StrCat("no version of ", base,
                                   newer_than >= 0 ? absl::StrCat(" newer than ", newer_than) : "",
                                   " reads (", failed, " tried): ", tried));
}

absl::StatusOr<std::unique_ptr<ServingModel>> ReadExportAt(const std::string& path,
                                                           const ReadExportOptions& options,
                                                           Env* env) {
  if (PathExists(path + "/" + kExportFileName)) return ReadExport(path, options);
  ASSIGN_OR_RETURN(std::unique_ptr<ServingModel> m, ReadNewestExport(path, -1, options));
  if (m != nullptr) return m;
  absl::StatusOr<std::string> none = ResolveExportDir(path, env);  // its NOT_FOUND message
  if (!none.ok()) return none.status();
  return absl::NotFoundError(absl::StrCat(path, ": its versions changed while read; try again"));
}

}  // namespace pstrain
