#pragma once
// `train` with "auto" layout choices (parallel.tp, pp, schedule, zero, recompute,
// train.micro_batch; parallel.dp "auto" alone needs no advice): the strategy advisor
// (train/layout_advisor.h) ranks the layouts the deck leaves open on the launched world by
// predicted step time among those whose memory plan fits a rank, and the run takes the first.
// The machine is parallel.profile's, or measured on the launched ranks when that is "".

#include <string>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/config/config.h"
#include "meshtrain/config/machine_profile.h"

namespace meshtrain {

// Collective over `world`: rank 0 reads parallel.profile (or all ranks measure one) and hands
// its text to every rank, so that every rank ranks the same layouts the same way and settles
// on the same one. Leaves `config` with its layout chosen and checked (check_layout), and
// nothing "auto" but dp resolved. Returns rank 0's report of the choice and the runner-up
// ("" elsewhere, and when the deck had nothing to choose). Throws DeckError (the same on every
// rank) when no layout fits.
std::string settle_auto_layout(Config& config, Communicator& world, int threads);

// Collective over the node, on every rank alike: where `config` leaves layout choices to a
// calibrated profile (parallel.profile names a measured one), rank 0's one line saying how this
// launch (`threads` per rank) differs from the launch the profile was calibrated under
// (config/launch_shape.h), "" when it does not, or elsewhere. Cheap: no file is read but on rank
// 0, nothing is measured but the binding and the MPI library's idle mode.
std::string launch_warning(const Config& config, Communicator& world, int threads);

}  // namespace meshtrain
