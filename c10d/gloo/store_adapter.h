// GlooStoreAdapter: a ferry::Store seen through gloo::rendezvous::Store, the
// interface Gloo's rendezvous (connectFullMesh) reads and writes addresses
// through.
//
// Gloo's interface reports errors by throwing; this adapter throws
// gloo::IoException carrying the Store's message and remembers the first
// error as an absl::Status (first_error()) so the caller, which must catch
// around every Gloo call, can return the precise Status (DeadlineExceeded
// naming the missing keys, Unavailable for a broken connection).
//
// Thread safety: as the wrapped store; first_error() is synchronized.
#ifndef FERRY_C10D_GLOO_STORE_ADAPTER_H_
#define FERRY_C10D_GLOO_STORE_ADAPTER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ferry/common/sync.h"
#include "gloo/rendezvous/store.h"
#include "ferry/store/store.h"

namespace ferry {
namespace c10d {

class GlooStoreAdapter : public ::gloo::rendezvous::Store {
 public:
  // `store` must not be null. `timeout` bounds get() and the one-argument
  // wait() (Gloo's own timeout is used when it passes one).
  GlooStoreAdapter(std::shared_ptr<ferry::Store> store, absl::Duration timeout);
  ~GlooStoreAdapter() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The first error any call threw for; OK if none.
  absl::Status first_error() const;

 private:
  [[noreturn]] void Throw(const absl::Status& status);

  const std::shared_ptr<ferry::Store> store_;
  const absl::Duration timeout_;
  mutable Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_GLOO_STORE_ADAPTER_H_
