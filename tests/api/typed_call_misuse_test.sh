#!/usr/bin/env bash
# Typed remote functions (ferry/rpc/remote_function.h) are checked at compile
# time: each misuse below must fail to compile, for the reason named, while
# the same program used correctly compiles (so a broken setup cannot pass).
set -uo pipefail
root="${TEST_SRCDIR:?}"
work="${TEST_TMPDIR:-$(mktemp -d)}"
prelude='#include <cstdint>
#include <string>
#include "ferry/ferry.h"
const ferry::rpc::RemoteFunction<int64_t(int64_t, int64_t)> kAdd("add");
void Use(ferry::Worker& w, ferry::rpc::FunctionRegistry& r) {'
compiles() {  # compiles NAME BODY -> 0 when it compiles
  printf '%s\n%s\n}\n' "$prelude" "$2" >"$work/$1.cc"
  g++ -std=c++20 -fsyntax-only -I"$root" "$work/$1.cc" >"$work/$1.log" 2>&1
}
fail=0
ok() {  # ok NAME BODY: must compile
  if compiles "$1" "$2"; then echo "ok   $1 compiles"; else
    echo "FAIL $1 should compile:"; head -30 "$work/$1.log"; fail=1; fi
}
bad() {  # bad NAME PATTERN BODY: must fail, with PATTERN in the errors
  if compiles "$1" "$3"; then
    echo "FAIL $1 compiled but must not"; fail=1
  elif ! grep -qE "$2" "$work/$1.log"; then
    echo "FAIL $1 failed for another reason than /$2/:"
    grep -m5 'error' "$work/$1.log"; fail=1
  else
    echo "ok   $1 refused: $(grep -m1 -oE "$2" "$work/$1.log")"
  fi
}
ok control '
  ferry::Result<int64_t> sum = w.rpc_sync("w1", kAdd, 2, 3);
  ferry::Future<int64_t> f = w.rpc_async("w1", kAdd, int64_t{2}, 3);
  (void)r.Register(kAdd, [](int64_t a, int64_t b) { return a + b; });
  (void)sum; (void)f;'
bad wrong_argument_type 'constraints not satisfied|no matching function' '
  auto r2 = w.rpc_sync("w1", kAdd, std::string("2"), 3); (void)r2;'
bad narrowing_argument 'constraints not satisfied|no matching function' '
  double d = 2.5; auto r2 = w.rpc_sync("w1", kAdd, d, 3); (void)r2;'
bad wrong_argument_count 'constraints not satisfied|no matching function' '
  auto r2 = w.rpc_sync("w1", kAdd, 2); (void)r2;'
bad wrong_result_type 'conversion from|cannot convert|no viable|invalid' '
  ferry::Result<std::string> s = w.rpc_sync("w1", kAdd, 2, 3); (void)s;'
bad implementation_parameters "does not take the remote function's parameters" '
  (void)r.Register(kAdd, [](std::string a, int64_t b) { return b; });'
bad implementation_result "is not the remote function's result type" '
  (void)r.Register(kAdd, [](int64_t a, int64_t b) { return std::string(); });'
exit $fail
