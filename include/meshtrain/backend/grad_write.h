#pragma once
// How a kernel writes a parameter's gradient: adds to what the buffer holds (the gradient of an
// earlier micro-batch, or of another use of the same parameter), or assigns it, where the write
// is the buffer's first in a step (beta 0: no pass fills the buffer with zeros first).

namespace meshtrain {

enum class GradWrite { Add, Assign };

}  // namespace meshtrain
