// Vectors that leave new elements uninitialised.
#pragma once

#include <memory>
#include <utility>
#include <vector>

namespace fp4lab {

// An allocator whose vectors leave new elements uninitialised, for buffers every element of which is written
// before it is read: zeroing them first would be a pass over memory of its own.
template <class T>
struct UninitAlloc : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitAlloc<U>;
  };
  UninitAlloc() = default;
  template <class U>
  UninitAlloc(const UninitAlloc<U>&) noexcept {}
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) ::new (static_cast<void*>(p)) U;
    else ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using F32Buffer = std::vector<float, UninitAlloc<float>>;
using F64Buffer = std::vector<double, UninitAlloc<double>>;

}  // namespace fp4lab
