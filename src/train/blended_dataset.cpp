#include "meshtrain/train/blended_dataset.h"

#include <sstream>
#include <stdexcept>

#include "meshtrain/config/deck_error.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/io/terminal_text.h"

namespace meshtrain {

namespace {
std::vector<double> weights_of(const std::vector<DataSource>& sources) {
  std::vector<double> w;
  for (const DataSource& s : sources) w.push_back(s.weight);
  return w;
}
}  // namespace

BlendedDataset::BlendedDataset(const Config& config, const std::vector<DataSource>& sources,
                               const std::string& key, const std::string& role)
    : key_(key), weights_(weights_of(sources)), schedule_(weights_) {
  for (const DataSource& s : sources) names_.push_back(s.name);
  for (int k = 0; k < static_cast<int>(sources.size()); ++k) {
    try {
      data_.push_back(std::make_unique<TokenDataset>(
          TokenDataset::from_shards(sources[k].paths, config.model.seq_len, role)));
    } catch (const DataError& e) {
      throw DataError(label(k), e.what());
    }
    samplers_.emplace_back(data_.back()->samples(), config.run.seed);
  }
  check_vocabularies(config);
}

std::string BlendedDataset::label(int k) const {
  return key_ + " source " + std::to_string(k) + " (name \"" + terminal_safe(names_[k]) + "\")";
}

// A blend mixes one tokenizer's ids: a source made with another tokenizer would train on
// tokens that mean something else. llm.c shards record no vocabulary (0) and pass.
void BlendedDataset::check_vocabularies(const Config& config) const {
  int first = -1;
  for (int k = 0; k < sources(); ++k) {
    const uint32_t v = data_[k]->vocab_size();
    if (v > static_cast<uint64_t>(config.model.vocab_size))
      throw DeckError(config.deck_path + ": " + label(k) + ": " + data_[k]->largest_vocab_source() +
                      " holds tokens of a vocabulary of " + std::to_string(v) +
                      ", more than model.vocab_size = " + std::to_string(config.model.vocab_size) +
                      " (" + data_[k]->describe() + "); set model.vocab_size >= " + std::to_string(v) +
                      " or use shards of the model's tokenizer");
    if (v == 0) continue;
    if (first < 0) {
      first = k;
    } else if (v != data_[first]->vocab_size()) {
      throw DeckError(config.deck_path + ": " + label(k) + ": " + data_[k]->largest_vocab_source() +
                      " has a vocabulary of " + std::to_string(v) + ", but " + label(first) + " (" +
                      data_[first]->largest_vocab_source() + ") has " +
                      std::to_string(data_[first]->vocab_size()) +
                      ": a blend's sources must be made with one tokenizer (meshtrain prepare "
                      "--tokenizer, the same for each)");
    }
  }
}

std::string BlendedDataset::describe() const {
  std::ostringstream os;
  os << sources() << " sources:";
  for (int k = 0; k < sources(); ++k)
    os << (k ? "; " : " ") << terminal_safe(names_[k]) << " weight " << weights_[k] << " ("
       << data_[k]->describe() << ")";
  return os.str();
}

void BlendedDataset::train_sample(const BlendDraw& d, int32_t* inputs, int32_t* targets) const {
  const int64_t n = data_[d.source]->samples();
  data_[d.source]->sample(samplers_[d.source].permute(d.position % n, d.position / n), inputs, targets);
}

void BlendedDataset::val_sample(const BlendDraw& d, int32_t* inputs, int32_t* targets) const {
  data_[d.source]->sample(d.position % data_[d.source]->samples(), inputs, targets);
}

BlendCursor::BlendCursor(const BlendSchedule& schedule, int64_t global_batch)
    : schedule_(&schedule), global_batch_(global_batch) {
  start_at(0, std::vector<int64_t>(static_cast<size_t>(schedule.sources()), 0));
}

void BlendCursor::start_at(int step, std::vector<int64_t> drawn) {
  origin_step_ = memo_step_ = step;
  origin_ = memo_ = std::move(drawn);
}

std::vector<int64_t> BlendCursor::counts_at(int step) {
  if (step < origin_step_)
    throw std::logic_error("BlendCursor: step " + std::to_string(step) + " precedes the run's first, " +
                           std::to_string(origin_step_));
  if (step < memo_step_) {  // a step re-run, or an earlier step asked again: from the origin
    memo_step_ = origin_step_;
    memo_ = origin_;
  }
  schedule_->draw(memo_, (step - memo_step_) * global_batch_);
  memo_step_ = step;
  return memo_;
}

std::vector<BlendDraw> BlendCursor::draws_of(int step) {
  std::vector<int64_t> drawn = counts_at(step);
  std::vector<BlendDraw> out;
  out.reserve(static_cast<size_t>(global_batch_));
  schedule_->draw(drawn, global_batch_, &out);
  return out;
}

}  // namespace meshtrain
