#include "ferry/ddp/optimizer_in_backward.h"

#include <memory>
#include <vector>

#include "ferry/common/status.h"

namespace ferry::ddp {
namespace {

// The entries of `all` at `indices`.
template <typename T>
std::vector<T> Pick(const std::vector<T>& all,
                    const std::vector<int>& indices) {
  std::vector<T> out;
  for (int i : indices) out.push_back(all[i]);
  return out;
}

// Writes `part` back to `all` at `indices`.
template <typename T>
void Put(std::vector<T>& all, const std::vector<int>& indices,
         const std::vector<T>& part) {
  for (size_t k = 0; k < indices.size(); ++k) all[indices[k]] = part[k];
}

}  // namespace

BucketOptimizer SgdInBackward(optim::SgdOptions options, size_t num_params) {
  auto state = std::make_shared<optim::SgdState>();
  state->momentum_buffer.resize(num_params);
  return [state, options](const std::vector<int>& indices,
                          const std::vector<Tensor>& params,
                          const std::vector<Tensor>& grads) -> absl::Status {
    optim::SgdState part;
    part.momentum_buffer = Pick(state->momentum_buffer, indices);
    RETURN_IF_ERROR(optim::SgdStep(params, grads, part, options));
    Put(state->momentum_buffer, indices, part.momentum_buffer);
    return absl::OkStatus();
  };
}

BucketOptimizer AdamInBackward(optim::AdamOptions options, size_t num_params,
                               bool decoupled_weight_decay) {
  auto state = std::make_shared<optim::AdamState>();
  state->step.resize(num_params, 0);
  state->exp_avg.resize(num_params);
  state->exp_avg_sq.resize(num_params);
  return [state, options, decoupled_weight_decay](
             const std::vector<int>& indices, const std::vector<Tensor>& params,
             const std::vector<Tensor>& grads) -> absl::Status {
    optim::AdamState part;
    part.step = Pick(state->step, indices);
    part.exp_avg = Pick(state->exp_avg, indices);
    part.exp_avg_sq = Pick(state->exp_avg_sq, indices);
    RETURN_IF_ERROR(decoupled_weight_decay
                        ? optim::AdamWStep(params, grads, part, options)
                        : optim::AdamStep(params, grads, part, options));
    Put(state->step, indices, part.step);
    Put(state->exp_avg, indices, part.exp_avg);
    Put(state->exp_avg_sq, indices, part.exp_avg_sq);
    return absl::OkStatus();
  };
}

}  // namespace ferry::ddp
