#pragma once
// Text from a file someone else made (a checkpoint's attributes and dataset names, an HF
// directory's tensor names) printed to a terminal. Printed raw, its bytes could be escape
// sequences that the terminal obeys: move the cursor, rewrite lines already printed (a
// "checksum OK" over a MISMATCH), retitle the window, or on some terminals write files.

#include <string>
#include <string_view>

namespace meshtrain {

// `text` with everything a terminal could take as a command written out as an escape: the C0
// controls and DEL ("\n", "\t", "\r", other bytes as "\x1b"), the C1 controls and the
// bidirectional-text controls that reorder what is shown ("\u{202e}"), and every byte that is
// not part of valid UTF-8 ("\xff"). Printable ASCII and the rest of UTF-8 pass unchanged.
std::string terminal_safe(std::string_view text);

}  // namespace meshtrain
