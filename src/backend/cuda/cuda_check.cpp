#include "cuda_check.h"

#include <stdexcept>

namespace meshtrain::cuda {

void fail(const char* op, const std::string& what) {
  throw std::runtime_error(std::string("backend 'cuda': ") + op + ": " + what);
}

void check(cudaError_t status, const char* op, const char* call) {
  if (status == cudaSuccess) return;
  fail(op, std::string(call) + " failed: " + cudaGetErrorString(status) + " (" +
               cudaGetErrorName(status) + ")");
}

void check_launch(const char* op) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return;
  fail(op, std::string("kernel launch failed: ") + cudaGetErrorString(status) + " (" +
               cudaGetErrorName(status) + ")");
}

}  // namespace meshtrain::cuda
