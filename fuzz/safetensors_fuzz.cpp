// Fuzzes the safetensors reader (io/safetensors.h): open() validates the header and the tensors'
// tiling of the data. It either accepts or throws SafetensorsError; an accepted file's every
// tensor must then read, with numel elements.

#include <cstdint>
#include <vector>

#include "fuzz_file.h"
#include "meshtrain/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static meshtrain::fuzz::ScratchFile file("model.safetensors");
  const std::string& path = file.write(data, size);
  try {
    const meshtrain::SafetensorsFile f = meshtrain::SafetensorsFile::open(path);
    for (const meshtrain::SafetensorsEntry& e : f.tensors()) {
      const std::vector<float> v = f.read_f32(e);
      if (static_cast<int64_t>(v.size()) != e.numel()) __builtin_trap();
    }
  } catch (const meshtrain::SafetensorsError&) {
  }
  return 0;
}
