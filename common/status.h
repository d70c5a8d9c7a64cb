// Status helpers shared by every Ferry layer.
//
// Ferry reports errors as values: absl::Status / absl::StatusOr<T> at every
// boundary, never exceptions (errors cross threads and callbacks, exceptions
// cannot). This header adds the propagation macros Abseil 20220623 lacks and
// lossless conversion to and from grpc::Status for the service edge.
//
// Thread safety: everything here is stateless.
#ifndef FERRY_COMMON_STATUS_H_
#define FERRY_COMMON_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function if it is not OK.
#define FERRY_RETURN_IF_ERROR(expr)                                    \
  do {                                                                 \
    ::absl::Status ferry_status_ = (expr);                             \
    if (ABSL_PREDICT_FALSE(!ferry_status_.ok())) return ferry_status_; \
  } while (0)

#define FERRY_STATUS_CONCAT_INNER_(a, b) a##b
#define FERRY_STATUS_CONCAT_(a, b) FERRY_STATUS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status from
// the enclosing function, otherwise moves the value into `lhs`, which may be a
// declaration (`auto x`) or an existing lvalue.
#define FERRY_ASSIGN_OR_RETURN(lhs, rexpr) \
  FERRY_ASSIGN_OR_RETURN_IMPL_(            \
      FERRY_STATUS_CONCAT_(ferry_statusor_, __LINE__), lhs, rexpr)

#define FERRY_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) {                \
    return std::move(statusor).status();                   \
  }                                                        \
  lhs = *std::move(statusor)

// Short names, as used throughout Ferry's sources.
#ifndef RETURN_IF_ERROR
// FERRY_RETURN_IF_ERROR (unless a RETURN_IF_ERROR is defined already).
#define RETURN_IF_ERROR(expr) FERRY_RETURN_IF_ERROR(expr)
#endif
#ifndef ASSIGN_OR_RETURN
// FERRY_ASSIGN_OR_RETURN (unless an ASSIGN_OR_RETURN is defined already).
#define ASSIGN_OR_RETURN(lhs, rexpr) FERRY_ASSIGN_OR_RETURN(lhs, rexpr)
#endif

namespace ferry {

// Returns `status` with `context` prepended to its message ("context: msg"),
// keeping its code. OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace ferry

#endif  // FERRY_COMMON_STATUS_H_
