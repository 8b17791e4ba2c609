#pragma once
// What a refused call says: the what() of the exception a test expects.
#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace rt_test {

/// The what() of the E that `f` throws; a test failure (and "") when `f`
/// returns or throws another std::exception.
template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception";
  return "";
}

}  // namespace rt_test
