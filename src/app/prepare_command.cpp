#include <cstdio>
#include <filesystem>
#include <stdexcept>

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
    if (!r.val_path.empty()) {
      std::printf("wrote %s (%lld tokens) and %s (%lld tokens)\n", r.train_path.c_str(),
                  static_cast<long long>(r.train_tokens), r.val_path.c_str(),
                  static_cast<long long>(r.val_tokens));
      return kExitOk;
    }
    std::printf("wrote %s (%lld tokens); no validation shard (--val-fraction 0): train with "
                "data.val = \"none\" or another validation shard\n",
                r.train_path.c_str(), static_cast<long long>(r.train_tokens));
    // A validation shard of an earlier run is not this text's: say so rather than delete it.
    const std::string stale = args.out_prefix + "_val.bin";
    std::error_code ec;
    if (std::filesystem::exists(stale, ec))
      std::fprintf(stderr, "meshtrain: warning: %s is left from an earlier prepare and does not "
                   "match %s\n", stale.c_str(), r.train_path.c_str());
    return kExitOk;
  } catch (const DataError& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    return kExitInput;
  } catch (const std::invalid_argument& e) {  // arguments main() could not check
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: internal error: %s\n", e.what());
    return kExitInternal;
  }
}

}  // namespace meshtrain
