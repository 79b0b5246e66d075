#pragma once
// Error checks for the CUDA backend. Every failing runtime call or kernel launch becomes a
// std::runtime_error naming the backend op, the call and the runtime's message:
//   backend 'cuda': layernorm_forward: kernel launch failed: invalid argument (cudaErrorInvalidValue)
// Library-specific checks (cuBLASLt, cuDNN, NCCL) live beside the code that uses each library.

#include <cuda_runtime_api.h>

#include <string>

namespace meshtrain::cuda {

[[noreturn]] void fail(const char* op, const std::string& what);
void check(cudaError_t status, const char* op, const char* call);
// After a kernel launch: reports launch-configuration errors at once (errors inside the kernel
// surface at the next synchronising call, which is checked too).
void check_launch(const char* op);

}  // namespace meshtrain::cuda

#define MESHTRAIN_CUDA_CHECK(op, call) ::meshtrain::cuda::check((call), (op), #call)
