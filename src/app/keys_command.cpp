#include <cstdio>

#include "meshtrain/app/commands.h"
#include "meshtrain/config/deck.h"

namespace meshtrain {

int keys_command() {
  std::printf("%s", deck_reference_markdown().c_str());
  return kExitOk;
}

}  // namespace meshtrain
