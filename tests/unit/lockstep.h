// Two engines' decode in lockstep to the end of the context (the pipelined-decode tests): each
// round both take one step and must return the same token, then both must fail with dq::Error
// (the context is full) at the same round. extra(i) checks what else round i must agree on.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/error.h"

namespace lockstep {

template <class A, class B, class Extra>
void to_context_end(A&& step_a, B&& step_b, const std::string& what, Extra&& extra) {
  for (int i = 0;; ++i) {
    bool full_a = false, full_b = false;
    int32_t ta = 0, tb = 0;
    try {
      ta = step_a();
    } catch (const dq::Error&) {
      full_a = true;
    }
    try {
      tb = step_b();
    } catch (const dq::Error&) {
      full_b = true;
    }
    ASSERT_EQ(full_a, full_b) << what << ": only one context ended, at step " << i;
    if (full_a) return;
    ASSERT_EQ(ta, tb) << what << " step " << i;
    extra(i);
  }
}

template <class A, class B>
void to_context_end(A&& step_a, B&& step_b, const std::string& what) {
  to_context_end(step_a, step_b, what, [](int) {});
}

}  // namespace lockstep
