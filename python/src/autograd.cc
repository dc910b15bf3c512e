// The autograd kernel of Tessera's dispatcher ops on CPU tensors, in C++ so that a call
// none of whose inputs needs a gradient costs what a native op's autograd step costs:
// it redispatches below autograd without entering Python. A call that needs gradients
// goes on to the op's Python autograd kernel (registered for the `Autograd` alias key,
// so it also holds `AutogradOther`, where this kernel sends it), which records the
// `autograd.Function`.
//
// Built against the headers of the PyTorch the extension is built with, into its own
// shared library (the extension itself depends only on PyTorch's stable C interface):
// the extension loads it after `import torch` and falls back to the Python kernels when
// it is missing or does not load (another PyTorch).
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>
#include <torch/library.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <typeinfo>

namespace {

// Whether grad mode is on and a tensor argument requires grad (the test the Python
// kernel makes).
bool needs_grad(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  if (!c10::GradMode::is_enabled()) {
    return false;
  }
  for (const auto& arg : torch::jit::last(stack, op.schema().arguments().size())) {
    if (arg.isTensor() && arg.toTensor().requires_grad()) {
      return true;
    }
  }
  return false;
}

// The CPU kernels' errors start with the Python exception they stand for.
bool starts_with(const char* message, const char* prefix) {
  return std::strncmp(message, prefix, std::strlen(prefix)) == 0;
}

void autograd_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                     torch::jit::Stack* stack) {
  const auto below = keys & c10::after_autograd_keyset;
  const auto python = below | c10::DispatchKeySet(c10::DispatchKey::AutogradOther);
  if (needs_grad(op, *stack)) {
    op.redispatchBoxed(python, stack);
    return;
  }
  // The arguments are copied first: a failed call retries through Python with them.
  const torch::jit::Stack arguments = *stack;
  try {
    op.redispatchBoxed(below, stack);
  } catch (const std::runtime_error& e) {
    // Only the CPU kernels' own errors (`tessera_throw`); PyTorch's and Python's
    // (fake kernels, modes) pass through untouched.
    if (typeid(e) != typeid(std::runtime_error)) {
      throw;
    }
    const char* message = e.what();
    if (starts_with(message, "ValueError: ")) {
      throw c10::ValueError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                            message + std::strlen("ValueError: "));
    }
    if (starts_with(message, "IndexError: ")) {
      throw c10::IndexError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                            message + std::strlen("IndexError: "));
    }
    if (!starts_with(message, "MemoryError: ")) {
      throw;
    }
    // No C++ exception becomes Python's MemoryError: the Python kernel raises it.
    *stack = arguments;
    op.redispatchBoxed(python, stack);
  }
}

std::string last_error;

}  // namespace

// The version of the PyTorch whose headers this was built with (`2.13.0`).
extern "C" const char* tessera_autograd_torch_version() { return TORCH_VERSION; }

// Registers the kernel above for `ns::name` for each of `count` names on CPU tensors.
// Returns null, or the error's message (valid until the next call).
extern "C" const char* tessera_register_autograd(const char* ns, const char* const* names,
                                                 std::size_t count) {
  try {
    // Registrations last for the life of the process, as the ops' own do.
    auto* library = new torch::Library(torch::Library::IMPL, ns, c10::DispatchKey::AutogradCPU,
                                       __FILE__, __LINE__);
    for (std::size_t i = 0; i < count; ++i) {
      library->impl(names[i], torch::CppFunction::makeFromBoxedFunction<&autograd_kernel>());
    }
    return nullptr;
  } catch (const std::exception& e) {
    last_error = e.what();
    return last_error.c_str();
  }
}
