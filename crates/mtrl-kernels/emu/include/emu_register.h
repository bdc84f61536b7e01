// Each kernel file's emulation unit (emu/<kernel>.cpp) exports one lookup,
// `mtrl_emu_find_<kernel>(name)`, from a kernel's name to a function that calls it with
// cuLaunchKernel-style arguments (`args[i]` points to the i-th argument's value).
#pragma once
#include <string.h>

#include <cstddef>
#include <type_traits>
#include <utility>

namespace mtrl_emu {

typedef void (*Invoke)(void** args);

template <typename... A, std::size_t... I>
void call_at(void (*k)(A...), void** args, std::index_sequence<I...>) {
  k(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}

template <typename... A>
void call(void (*k)(A...), void** args) {
  call_at(k, args, std::index_sequence_for<A...>{});
}

template <auto K>
void invoke(void** args) {
  call(K, args);
}

struct Entry {
  const char* name;
  Invoke f;
};

template <std::size_t N>
Invoke pick(const char* name, const Entry (&table)[N]) {
  for (const Entry& e : table) {
    if (strcmp(e.name, name) == 0) return e.f;
  }
  return nullptr;
}

}  // namespace mtrl_emu

#define MTRL_EMU_ENTRY(K) \
  mtrl_emu::Entry { #K, &mtrl_emu::invoke<K> }
