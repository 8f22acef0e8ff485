#include "worker/model/mlp.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/parallel.h"
#include "common/status.h"

namespace pstrain {

using dnnl::memory;
using Dt = dnnl::memory::data_type;
using Tag = dnnl::memory::format_tag;

namespace {

inline float ToFloat(float x) { return x; }
inline float ToFloat(uint16_t x) { return Bf16ToFloat(x); }

// The row loops below take restrict pointers (not lambda captures, which the compiler must reload
// after every store) so that they vectorize.

// sum_j a_j w_j.
template <typename T>
float Dot(const T* __restrict a, const float* __restrict w, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += ToFloat(a[j]) * w[j];
  return s;
}

// One example of the output layer's backward and the last ReLU: dw_j += g a_j,
// dz_j = a_j > 0 ? g w_j : 0, db_j += dz_j.
template <typename T>
void OutputBackwardRow(const T* __restrict a, const float* __restrict w, float g, int64_t n,
                       float* __restrict dz, float* __restrict dw, float* __restrict db) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float aj = ToFloat(a[j]);
    dw[j] += g * aj;
    const float d = aj > 0.f ? g * w[j] : 0.f;
    dz[j] = d;
    db[j] += d;
  }
}

#if defined(__AVX2__)
// OutputBackwardRow (kRelu false) or ReluBackwardRow (kRelu true) over examples [begin, end) of
// an f32 layer of width n, 32 columns at a time: the block's dw and db sums stay in registers
// over the examples instead of a load and a store of each per element (the row loops' cost:
// ~2% of DLRM's step). Each column is still summed over the examples in order with the row
// loops' operations (a product then a sum: -std=c++17 does not contract them into an fma),
// so the floats are the row loops' (preset_golden_test holds DeepFM's bit for bit).
template <bool kRelu>
void BackwardColumnBlocks(const float* __restrict a, const float* __restrict w,
                          const float* __restrict g, int64_t begin, int64_t end, int64_t n,
                          float* __restrict dz, float* __restrict dw, float* __restrict db) {
  const __m256 zero = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    __m256 sw[4], sb[4], wj[4];
    for (int v = 0; v < 4; ++v) {
      if (!kRelu) sw[v] = _mm256_loadu_ps(dw + j + 8 * v);
      if (!kRelu) wj[v] = _mm256_loadu_ps(w + j + 8 * v);
      sb[v] = _mm256_loadu_ps(db + j + 8 * v);
    }
    for (int64_t b = begin; b < end; ++b) {
      const float* ab = a + b * n + j;
      float* db_row = dz + b * n + j;
      const __m256 gb = kRelu ? zero : _mm256_set1_ps(g[b]);
      for (int v = 0; v < 4; ++v) {
        const __m256 av = _mm256_loadu_ps(ab + 8 * v);
        const __m256 pos = _mm256_cmp_ps(av, zero, _CMP_GT_OQ);
        __m256 d;
        if (kRelu) {
          d = _mm256_and_ps(_mm256_loadu_ps(db_row + 8 * v), pos);
        } else {
          sw[v] = _mm256_add_ps(sw[v], _mm256_mul_ps(gb, av));
          d = _mm256_and_ps(_mm256_mul_ps(gb, wj[v]), pos);
        }
        _mm256_storeu_ps(db_row + 8 * v, d);
        sb[v] = _mm256_add_ps(sb[v], d);
      }
    }
    for (int v = 0; v < 4; ++v) {
      if (!kRelu) _mm256_storeu_ps(dw + j + 8 * v, sw[v]);
      _mm256_storeu_ps(db + j + 8 * v, sb[v]);
    }
  }
  // The last n % 32 columns, as the row loops do them.
  for (int64_t b = begin; b < end && j < n; ++b) {
    const float* __restrict ab = a + b * n;
    float* __restrict d = dz + b * n;
    if (kRelu) {
      for (int64_t c = j; c < n; ++c) {
        const float dc = ab[c] > 0.f ? d[c] : 0.f;
        d[c] = dc;
        db[c] += dc;
      }
    } else {
      for (int64_t c = j; c < n; ++c) {
        dw[c] += g[b] * ab[c];
        const float dc = ab[c] > 0.f ? g[b] * w[c] : 0.f;
        d[c] = dc;
        db[c] += dc;
      }
    }
  }
}
#endif

// One example of a hidden ReLU's backward, in place: d_j = a_j > 0 ? d_j : 0, db_j += d_j.
template <typename T>
void ReluBackwardRow(const T* __restrict a, int64_t n, float* __restrict d, float* __restrict db) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float dj = ToFloat(a[j]) > 0.f ? d[j] : 0.f;
    d[j] = dj;
    db[j] += dj;
  }
}

// One primitive and its arguments. Arguments whose buffer changes per call (the dense vector,
// dense_grad, the scratchpad) are created without a handle and set before each run.
struct Exec {
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
  std::string impl;

  void Set(int arg, const void* p) { args.at(arg).set_data_handle(const_cast<void*>(p)); }
  void Run(dnnl::stream& s) { prim.execute(s, args); }
};

absl::Status DnnlError(const dnnl::error& e, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("oneDNN ", what, ": ", e.what(), " (status ", static_cast<int>(e.status), ")"));
}

}  // namespace

struct Mlp::Plan {
  int n = 0;
  std::vector<Exec> fwd, bwd_data, bwd_weights;
};

Mlp::Mlp(const Options& options) : opt_(options) {}
Mlp::~Mlp() = default;

absl::StatusOr<std::unique_ptr<Mlp>> Mlp::Create(const Options& options) {
  if (options.hidden.empty() || options.max_batch <= 0 || options.threads <= 0) {
    return absl::InvalidArgumentError("Mlp needs at least one layer, max_batch > 0, threads > 0");
  }
  for (size_t l = 0; l < options.hidden.size(); ++l) {
    const Layer& layer = options.hidden[l];
    if (layer.in <= 0 || layer.out <= 0 || (l > 0 && layer.in != options.hidden[l - 1].out)) {
      return absl::InvalidArgumentError(absl::StrCat("Mlp layer ", l, " has bad sizes"));
    }
  }
  std::unique_ptr<Mlp> mlp(new Mlp(options));
  try {
    mlp->engine_ = dnnl::engine(dnnl::engine::kind::cpu, 0);
    mlp->stream_ = dnnl::stream(mlp->engine_);
  } catch (const dnnl::error& e) {
    return DnnlError(e, "creating the CPU engine");
  }
  const size_t batch = options.max_batch;
  int width = 0;
  for (const Layer& layer : options.hidden) width = std::max(width, layer.out);
  if (options.bf16) {
    mlp->x0_bf16_ = AlignedArray<uint16_t>(batch * mlp->input_dim());
    for (const Layer& layer : options.hidden) {
      mlp->act_bf16_.emplace_back(batch * layer.out);
      mlp->w_bf16_.emplace_back(static_cast<size_t>(layer.in) * layer.out);
    }
    mlp->dz_bf16_ = AlignedArray<uint16_t>(batch * width);
    mlp->src_t_bf16_ = AlignedArray<uint16_t>(batch * std::max(width, mlp->input_dim()));
    mlp->dz_f32_[0] = AlignedArray<float>(batch * width);
  } else {
    mlp->x0_f32_ = AlignedArray<float>(batch * mlp->input_dim());
    for (const Layer& layer : options.hidden) {
      mlp->act_f32_.emplace_back(batch * layer.out);
      mlp->w_f32_.emplace_back(static_cast<size_t>(layer.in) * layer.out);
    }
    mlp->dz_f32_[0] = AlignedArray<float>(batch * width);
    mlp->dz_f32_[1] = AlignedArray<float>(batch * width);
  }
  mlp->dx0_ = AlignedArray<float>(batch * mlp->input_dim());
  mlp->width_ = width;
  mlp->partial_ = AlignedArray<float>(static_cast<size_t>(options.threads) * 2 * width);
  return mlp;
}

void* Mlp::act(int l) {
  return opt_.bf16 ? static_cast<void*>(act_bf16_[l].data())
                   : static_cast<void*>(act_f32_[l].data());
}

absl::StatusOr<std::unique_ptr<Mlp::Plan>> Mlp::CreatePlan(int n) {
  const Dt dt = opt_.bf16 ? Dt::bf16 : Dt::f32;
  const int num_layers = static_cast<int>(opt_.hidden.size());
  auto plan = std::make_unique<Plan>();
  plan->n = n;
  size_t scratch = 0;
  // primitive_attr is a reference-counted handle: copies share state, so build each one fresh.
  auto make_attr = [](const dnnl::post_ops* ops) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (ops != nullptr) attr.set_post_ops(*ops);
    return attr;
  };
  try {
    for (int l = 0; l < num_layers; ++l) {
      const memory::dim K = opt_.hidden[l].in, N = opt_.hidden[l].out, M = n;
      void* src = l == 0 ? (opt_.bf16 ? static_cast<void*>(x0_bf16_.data())
                                      : static_cast<void*>(x0_f32_.data()))
                         : act(l - 1);
      void* weights_bf16 = opt_.bf16 ? w_bf16_[l].data() : nullptr;
      // dz_l: where the gradient w.r.t. this layer's pre-activation lives (see mlp.h).
      void* dz = opt_.bf16 ? static_cast<void*>(dz_bf16_.data())
                           : static_cast<void*>(dz_f32_[l % 2].data());
      float* dx = l == 0 ? dx0_.data() : dz_f32_[opt_.bf16 ? 0 : (l - 1) % 2].data();

      auto add = [&](std::vector<Exec>* list, const dnnl::matmul::primitive_desc& pd,
                     std::unordered_map<int, memory> args) {
        scratch = std::max(scratch, pd.scratchpad_desc().get_size());
        args.emplace(DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), engine_, nullptr));
        list->push_back(Exec{dnnl::matmul(pd), std::move(args), pd.impl_info_str()});
      };

      // Forward: a_l = ReLU(src W + b).
      const memory::desc src_md({M, K}, dt, Tag::ab), w_md({K, N}, dt, Tag::ab),
          b_md({1, N}, Dt::f32, Tag::ab), a_md({M, N}, dt, Tag::ab);
      dnnl::post_ops relu;
      relu.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
      add(&plan->fwd,
          dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, w_md, b_md, a_md),
                                       make_attr(&relu), engine_),
          {{DNNL_ARG_SRC, memory(src_md, engine_, src)},
           {DNNL_ARG_WEIGHTS, memory(w_md, engine_, weights_bf16)},
           {DNNL_ARG_BIAS, memory(b_md, engine_, nullptr)},
           {DNNL_ARG_DST, memory(a_md, engine_, act(l))}});

      // Backward-weights: dW += src^T dz, accumulated by a sum post-op; src^T is read through
      // strides (f32) or from the transposed copy (bf16, see mlp.h).
      const memory::desc srct_md = opt_.bf16 ? memory::desc({K, M}, dt, Tag::ab)
                                             : memory::desc({K, M}, dt, memory::dims{1, K});
      void* srct = opt_.bf16 ? static_cast<void*>(src_t_bf16_.data()) : src;
      const memory::desc dz_md({M, N}, dt, Tag::ab), dw_md({K, N}, Dt::f32, Tag::ab);
      dnnl::post_ops sum;
      sum.append_sum(1.f);
      add(&plan->bwd_weights,
          dnnl::matmul::primitive_desc(dnnl::matmul::desc(srct_md, dz_md, dw_md), make_attr(&sum),
                                       engine_),
          {{DNNL_ARG_SRC, memory(srct_md, engine_, srct)},
           {DNNL_ARG_WEIGHTS, memory(dz_md, engine_, dz)},
           {DNNL_ARG_DST, memory(dw_md, engine_, nullptr)}});

      // Backward-data: dx = dz W^T (f32), W^T read through strides.
      const memory::desc wt_md({N, K}, dt, memory::dims{1, N}), dx_md({M, K}, Dt::f32, Tag::ab);
      add(&plan->bwd_data,
          dnnl::matmul::primitive_desc(dnnl::matmul::desc(dz_md, wt_md, dx_md), make_attr(nullptr),
                                       engine_),
          {{DNNL_ARG_SRC, memory(dz_md, engine_, dz)},
           {DNNL_ARG_WEIGHTS, memory(wt_md, engine_, weights_bf16)},
           {DNNL_ARG_DST, memory(dx_md, engine_, dx)}});
    }
  } catch (const dnnl::error& e) {
    return DnnlError(e, absl::StrCat("creating the MLP primitives for batch ", n));
  }
  if (scratch > scratchpad_.size()) scratchpad_ = AlignedArray<uint8_t>(scratch);
  // A reference implementation is orders of magnitude slower: say so once per tower.
  for (const auto* list : {&plan->fwd, &plan->bwd_data, &plan->bwd_weights}) {
    for (const Exec& e : *list) {
      if (e.impl.rfind("ref", 0) == 0 && !warned_slow_) {
        warned_slow_ = true;
        PSTRAIN_LOG(WARNING) << "oneDNN runs the MLP with its reference implementation (" << e.impl
                             << "): this CPU lacks the ISA for "
                             << (opt_.bf16 ? "bf16 (AVX512-BF16 / AMX)" : "fast f32");
      }
    }
  }
  return plan;
}

absl::StatusOr<Mlp::Plan*> Mlp::GetPlan(int n) {
  if (n <= 0 || n > opt_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("MLP batch of ", n, ", expected 1..", opt_.max_batch));
  }
  for (auto it = plans_.begin(); it != plans_.end(); ++it) {
    if ((*it)->n == n) {
      plans_.splice(plans_.begin(), plans_, it);
      return plans_.front().get();
    }
  }
  // A handful of sizes covers training (max_batch and an epoch's last slice) and evaluation.
  constexpr size_t kMaxPlans = 8;
  ASSIGN_OR_RETURN(std::unique_ptr<Plan> plan, CreatePlan(n));
  plans_.push_front(std::move(plan));
  if (plans_.size() > kMaxPlans) plans_.pop_back();
  return plans_.front().get();
}

absl::StatusOr<std::string> Mlp::ImplInfo(int n) {
  ASSIGN_OR_RETURN(Plan * plan, GetPlan(n));
  return absl::StrCat("fwd=", plan->fwd[0].impl, " bwd_data=", plan->bwd_data[0].impl,
                      " bwd_weights=", plan->bwd_weights[0].impl);
}

absl::Status Mlp::Forward(int n, const float* dense, float* logits) {
  if (n <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(Plan * plan, GetPlan(n));
  const int threads = opt_.threads;
  if (opt_.bf16) {
    // The bf16 copy of the master weights, refreshed every step.
    for (size_t l = 0; l < opt_.hidden.size(); ++l) {
      const float* w = dense + opt_.hidden[l].w;
      uint16_t* wb = w_bf16_[l].data();
      const int64_t size = static_cast<int64_t>(opt_.hidden[l].in) * opt_.hidden[l].out;
      ParallelFor((size + 1023) / 1024, threads, [&](int, int, int64_t b, int64_t e) {
        const int64_t begin = b * 1024, end = std::min(size, e * 1024);
        FloatToBf16(w + begin, wb + begin, end - begin);
      });
    }
  }
  try {
    for (size_t l = 0; l < opt_.hidden.size(); ++l) {
      Exec& fwd = plan->fwd[l];
      if (!opt_.bf16) {
        const float* w = dense + opt_.hidden[l].w;
        if (reinterpret_cast<uintptr_t>(w) % 64 != 0) {
          // Misaligned in the dense vector: the forward reads an aligned copy (see mlp.h).
          float* copy = w_f32_[l].data();
          const int64_t size = static_cast<int64_t>(opt_.hidden[l].in) * opt_.hidden[l].out;
          ParallelFor(size, threads, [&](int, int, int64_t begin, int64_t end) {
            std::copy(w + begin, w + end, copy + begin);
          });
          w = copy;
        }
        fwd.Set(DNNL_ARG_WEIGHTS, w);
      }
      fwd.Set(DNNL_ARG_BIAS, dense + opt_.hidden[l].b);
      fwd.Set(DNNL_ARG_SCRATCHPAD, scratchpad_.data());
      fwd.Run(stream_);
    }
    stream_.wait();
  } catch (const dnnl::error& e) {
    return DnnlError(e, "MLP forward");
  }
  const int last = static_cast<int>(opt_.hidden.size()) - 1;
  const int64_t N = opt_.hidden[last].out;
  const float* w = dense + opt_.out_w;
  const float bias = dense[opt_.out_b];
  auto output = [&](auto* a) {
    ParallelFor(n, threads, [&](int, int, int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        logits[b] += Dot(a + b * N, w, N) + bias;
      }
    });
  };
  if (opt_.bf16) {
    output(act_bf16_[last].data());
  } else {
    output(act_f32_[last].data());
  }
  return absl::OkStatus();
}

// The output layer's backward fused with the last hidden layer's ReLU mask:
//   d out/w_j += sum_b g_b a_bj, d out/b += sum_b g_b,
//   dz_bj = g_b w_j [a_bj > 0], d b_last += sum_b dz_b.
template <typename T>
void Mlp::OutputBackward(int n, const float* dense, const float* g, float* dense_grad) {
  const int last = static_cast<int>(opt_.hidden.size()) - 1;
  const int64_t N = opt_.hidden[last].out;
  const int threads = opt_.threads;
  const T* a = static_cast<const T*>(act(last));
  const float* w = dense + opt_.out_w;
  float* dz = dz_f32_[opt_.bf16 ? 0 : last % 2].data();
  const int64_t stride = 2 * width_;
  partial_.Zero();
  ParallelFor(n, threads, [&](int ithr, int, int64_t begin, int64_t end) {
    float* dw = partial_.data() + ithr * stride;
    float* db = dw + N;
#if defined(__AVX2__)
    if constexpr (std::is_same_v<T, float>) {
      BackwardColumnBlocks<false>(a, w, g, begin, end, N, dz, dw, db);
      return;
    }
#endif
    for (int64_t b = begin; b < end; ++b) {
      OutputBackwardRow(a + b * N, w, g[b], N, dz + b * N, dw, db);
      if (opt_.bf16) FloatToBf16(dz + b * N, dz_bf16_.data() + b * N, N);
    }
  });
  float* gw = dense_grad + opt_.out_w;
  float* gb = dense_grad + opt_.hidden[last].b;
  for (int t = 0; t < threads; ++t) {
    const float* dw = partial_.data() + t * stride;
    for (int64_t j = 0; j < N; ++j) {
      gw[j] += dw[j];
      gb[j] += dw[N + j];
    }
  }
  float gsum = 0.f;
  for (int b = 0; b < n; ++b) gsum += g[b];
  dense_grad[opt_.out_b] += gsum;
}

// Hidden layer l-1's ReLU mask after layer l's backward-data: dz = dx [a_{l-1} > 0] (in place
// in f32; into dz_bf16_ in bf16), d b_{l-1} += column sums of dz.
template <typename T>
void Mlp::ReluBackward(int n, int l, float* dense_grad) {
  const int64_t N = opt_.hidden[l - 1].out;
  const int threads = opt_.threads;
  const T* a = static_cast<const T*>(act(l - 1));
  float* dx = dz_f32_[opt_.bf16 ? 0 : (l - 1) % 2].data();
  const int64_t stride = 2 * width_;
  partial_.Zero();
  ParallelFor(n, threads, [&](int ithr, int, int64_t begin, int64_t end) {
    float* db = partial_.data() + ithr * stride;
    for (int64_t b = begin; b < end; ++b) {
      ReluBackwardRow(a + b * N, N, dx + b * N, db);
      if (opt_.bf16) FloatToBf16(dx + b * N, dz_bf16_.data() + b * N, N);
    }
  });
  float* gb = dense_grad + opt_.hidden[l - 1].b;
  for (int t = 0; t < threads; ++t) {
    const float* db = partial_.data() + t * stride;
    for (int64_t j = 0; j < N; ++j) gb[j] += db[j];
  }
}

absl::Status Mlp::Backward(int n, const float* dense, const float* g, float* dense_grad) {
  if (n <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(Plan * plan, GetPlan(n));
  if (opt_.bf16) {
    OutputBackward<uint16_t>(n, dense, g, dense_grad);
  } else {
    OutputBackward<float>(n, dense, g, dense_grad);
  }
  try {
    for (int l = static_cast<int>(opt_.hidden.size()) - 1; l >= 0; --l) {
      if (opt_.bf16) {
        const uint16_t* src = l == 0 ? x0_bf16_.data() : act_bf16_[l - 1].data();
        const int64_t K = opt_.hidden[l].in;
        ParallelFor((n + 7) / 8, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
          const int64_t r0 = begin * 8, r1 = std::min<int64_t>(n, end * 8);
          Transpose16(src + r0 * K, r1 - r0, K, src_t_bf16_.data() + r0, n);
        });
      }
      Exec& bww = plan->bwd_weights[l];
      bww.Set(DNNL_ARG_DST, dense_grad + opt_.hidden[l].w);
      bww.Set(DNNL_ARG_SCRATCHPAD, scratchpad_.data());
      bww.Run(stream_);
      Exec& bwd = plan->bwd_data[l];
      if (!opt_.bf16) bwd.Set(DNNL_ARG_WEIGHTS, dense + opt_.hidden[l].w);
      bwd.Set(DNNL_ARG_SCRATCHPAD, scratchpad_.data());
      bwd.Run(stream_);
      stream_.wait();
      if (l == 0) break;
      if (opt_.bf16) {
        ReluBackward<uint16_t>(n, l, dense_grad);
      } else {
        ReluBackward<float>(n, l, dense_grad);
      }
    }
  } catch (const dnnl::error& e) {
    return DnnlError(e, "MLP backward");
  }
  return absl::OkStatus();
}

}  // namespace pstrain
