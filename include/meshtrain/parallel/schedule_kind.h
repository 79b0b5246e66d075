#pragma once
// Which pipeline schedule a run uses (deck parallel.schedule); the generators are in
// parallel/schedule.h. A header of its own so that the configuration can name one without the
// schedule language.

#include <string_view>

namespace meshtrain {

enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZeroBubbleH1, ZeroBubbleV };
// "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"
std::string_view schedule_name(ScheduleKind kind);

}  // namespace meshtrain
