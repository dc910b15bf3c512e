// Raises a C++ exception for the ops the extension registers with PyTorch's dispatcher.
// Their kernels are Rust and cannot throw; PyTorch turns a std::exception escaping a
// kernel into a Python RuntimeError carrying the message. Only the C++ standard library
// is used here, so the extension does not depend on PyTorch's C++ ABI.
#include <cstddef>
#include <stdexcept>
#include <string>

extern "C" [[noreturn]] void tessera_throw(const char* message, std::size_t length) {
  throw std::runtime_error(std::string(message, length));
}
