#pragma once
// The effective configuration of a run as canonical TOML: every deck key with the value the run
// uses — the deck's text with its --set overrides applied, defaults filled in, and what was
// resolved before training (parallel.dp, run.device and with it train.precision). Checkpoints store it next
// to the deck's text, so that what a checkpoint says about its model is what the run trained,
// not what the deck file says without its overrides. It is not a parser: parse_deck() reads the
// dump back (tests/config/config_dump_test.cpp checks both directions and that every key of the
// schema is here).

#include <string>

#include "meshtrain/config/config.h"

namespace meshtrain {

// One "[section]" table per deck section, one "key = value" line per key, in the reference's
// order; floats in their shortest round-trip form. parallel.partition is left out when empty
// (balanced).
std::string dump_config(const Config& config);

}  // namespace meshtrain
