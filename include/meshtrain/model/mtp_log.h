#pragma once
// The multi-token prediction losses (model/mtp_module.h) as the step line and metrics.jsonl show
// them, from the job's step statistics, whose last 2 x mtp_layers numbers are each depth's
// cross-entropy sum and its rows over the whole job (DecoderModel::take_step_statistics).

#include <string>
#include <vector>

#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/pipeline_stage.h"

namespace meshtrain {

// Each depth's mean cross-entropy over the step; empty without depths.
std::vector<double> mtp_depth_losses(const std::vector<double>& job_statistics, const ModelSpec& spec);
// " | mtp_loss 3.41" (the mean over depths), or nothing without depths.
std::string mtp_loss_progress(const std::vector<double>& job_statistics, const ModelSpec& spec);
// One record {step, mtp_loss (the mean over depths), mtp_depth_losses}, or none without depths.
std::vector<MetricsRecord> mtp_loss_records(int step, const std::vector<double>& job_statistics,
                                            const ModelSpec& spec);

}  // namespace meshtrain
