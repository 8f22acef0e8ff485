#include "worker/model/matmul.h"

#include <string>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"

namespace pstrain {

using dnnl::memory;
using Dt = dnnl::memory::data_type;

Matmuls::Matmuls() = default;

absl::Status Matmuls::Run(const Shape& s, const float* a, const float* b, float* c) {
  return RunTyped(s, /*bf16=*/false, a, b, c);
}

absl::Status Matmuls::RunBf16(const Shape& s, const uint16_t* a, const uint16_t* b, float* c) {
  return RunTyped(s, /*bf16=*/true, a, b, c);
}

absl::Status Matmuls::RunRoundedToBf16(const Shape& s, const float* a, const float* b,
                                       float* c, int threads) {
  const size_t na = static_cast<size_t>(s.m) * s.k, nb = static_cast<size_t>(s.k) * s.n;
  if (a16_.size() < na) a16_ = AlignedArray<uint16_t>(na);
  if (b16_.size() < nb) b16_ = AlignedArray<uint16_t>(nb);
  ParallelFor(static_cast<int64_t>(na), threads, [&](int, int, int64_t begin, int64_t end) {
    FloatToBf16(a + begin, a16_.data() + begin, end - begin);
  });
  ParallelFor(static_cast<int64_t>(nb), threads, [&](int, int, int64_t begin, int64_t end) {
    FloatToBf16(b + begin, b16_.data() + begin, end - begin);
  });
  return RunBf16(s, a16_.data(), b16_.data(), c);
}

absl::Status Matmuls::RunTyped(const Shape& s, bool bf16, const void* a, const void* b,
                               float* c) {
  if (s.m <= 0 || s.n <= 0 || s.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Matmuls: empty shape ", s.m, " x ", s.k, " x ", s.n));
  }
  try {
    if (!engine_) {
      engine_ = dnnl::engine(dnnl::engine::kind::cpu, 0);
      stream_ = dnnl::stream(engine_);
    }
    const Key key{s.m, s.k, s.n, s.trans_a, s.trans_b, s.accumulate, bf16};
    const Dt in = bf16 ? Dt::bf16 : Dt::f32;
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      // A few shapes per block and batch size; a tower that cycles through many batch sizes
      // (evaluation tails) starts over rather than growing without bound.
      if (cache_.size() >= 64) cache_.clear();
      Entry e;
      e.a = s.trans_a ? memory::desc({s.m, s.k}, in, memory::dims{1, s.m})
                      : memory::desc({s.m, s.k}, in, memory::dims{s.k, 1});
      e.b = s.trans_b ? memory::desc({s.k, s.n}, in, memory::dims{1, s.k})
                      : memory::desc({s.k, s.n}, in, memory::dims{s.n, 1});
      e.c = memory::desc({s.m, s.n}, Dt::f32, memory::dims{s.n, 1});
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (s.accumulate) {
        dnnl::post_ops sum;
        sum.append_sum(1.f);
        attr.set_post_ops(sum);
      }
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.a, e.b, e.c), attr, engine_);
      if (pd.scratchpad_desc().get_size() > scratchpad_.size()) {
        scratchpad_ = AlignedArray<uint8_t>(pd.scratchpad_desc().get_size());
      }
      e.scratchpad = pd.scratchpad_desc();
      e.prim = dnnl::matmul(pd);
      it = cache_.emplace(key, std::move(e)).first;
    }
    const Entry& e = it->second;
    e.prim.execute(stream_, {{DNNL_ARG_SRC, memory(e.a, engine_, const_cast<void*>(a))},
                             {DNNL_ARG_WEIGHTS, memory(e.b, engine_, const_cast<void*>(b))},
                             {DNNL_ARG_DST, memory(e.c, engine_, c)},
                             {DNNL_ARG_SCRATCHPAD, memory(e.scratchpad, engine_, scratchpad_.data())}});
    stream_.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN matmul ", s.m, " x ", s.k, " x ", s.n, ": ",
                                            e.what(), " (status ", static_cast<int>(e.status),
                                            ")"));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
