// Thread-local grad mode: while disabled (NoGradGuard), differentiable ops
// record no graph and their results do not require grad.
//
// Thread safety: the mode is per thread; a guard must be destroyed on the
// thread that created it.
#ifndef FERRY_AUTOGRAD_GRAD_MODE_H_
#define FERRY_AUTOGRAD_GRAD_MODE_H_

namespace ferry::autograd {

// This thread's grad mode (enabled by default).
class GradMode {
 public:
  static bool IsEnabled();  // Whether ops record graphs here.
  static void SetEnabled(bool enabled);  // Sets it for this thread.
};

// RAII: disables grad mode on this thread for its lifetime, then restores
// the previous mode (guards nest).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::IsEnabled()) { GradMode::SetEnabled(false); }
  ~NoGradGuard() { GradMode::SetEnabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace ferry::autograd

#endif  // FERRY_AUTOGRAD_GRAD_MODE_H_
