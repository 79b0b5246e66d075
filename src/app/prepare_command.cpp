#include <cstdio>

#include "meshtrain/app/commands.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/io/prepare.h"
#include "meshtrain/train/data_feed.h"

namespace meshtrain {

int prepare_command(const PrepareArgs& args) {
  try {
    const PrepareResult r =
        args.synthetic_bytes > 0
            ? prepare_synthetic(kSyntheticTrainSeed, static_cast<size_t>(args.synthetic_bytes),
                                args.out_prefix, args.val_fraction)
            : prepare_text_files(args.inputs, args.out_prefix, args.val_fraction);
    std::printf("wrote %s (%lld tokens) and %s (%lld tokens)\n", r.train_path.c_str(),
                static_cast<long long>(r.train_tokens), r.val_path.c_str(),
                static_cast<long long>(r.val_tokens));
    return kExitOk;
  } catch (const DataError& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    return kExitInput;
  }
}

}  // namespace meshtrain
