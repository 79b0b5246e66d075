#include "meshtrain/io/prepare.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "meshtrain/backend/thread_limit.h"
#include "meshtrain/io/byte_tokenizer.h"
#include "meshtrain/io/compressed_reader.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/io/jsonl_documents.h"
#include "meshtrain/io/regular_file.h"
#include "meshtrain/io/synthetic_corpus.h"
#include "meshtrain/io/text_cut.h"
#include "meshtrain/io/token_shard.h"
#include "meshtrain/io/utf8_text.h"

namespace meshtrain {

namespace {

void check_fraction(double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    throw std::invalid_argument("prepare: val_fraction = " + std::to_string(val_fraction) +
                                " must lie in [0, 1) (e.g. 0.1; 0: no validation shard)");
  }
}

// The prefix names files, not a directory: "data/" would write "data/_train.bin".
void check_out_prefix(const std::string& out_prefix) {
  std::error_code ec;
  if (out_prefix.empty() || out_prefix.back() == '/' ||
      std::filesystem::is_directory(out_prefix, ec)) {
    throw std::invalid_argument("prepare: --out " + out_prefix +
                                " is a directory; --out takes a file prefix (e.g. --out "
                                "data/mytext writes data/mytext_train.bin and "
                                "data/mytext_val.bin)");
  }
}

void make_parent_directory(const std::string& out_prefix) {
  const std::filesystem::path dir = std::filesystem::path(out_prefix).parent_path();
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw DataError(dir.string(), "cannot create output directory: " + ec.message());
}

}  // namespace

// Every input is checked before anything is written: a bad path late in a long list must not
// cost the hour spent on the files before it.
uint64_t check_text_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw DataError(path, std::string("cannot open text file: ") + std::strerror(errno));
  if (S_ISDIR(st.st_mode))
    throw DataError(path, "is a directory, not a text file (give the files in it, e.g. " +
                              (std::filesystem::path(path) / "*.txt").string() + ")");
  // Before the probe's open, which would block on a FIFO with no writer.
  require_regular_file(path, "a text file", "a text file to tokenize");
  std::ifstream probe(path, std::ios::binary);
  if (!probe) throw DataError(path, std::string("cannot open text file: ") + std::strerror(errno));
  if (st.st_size == 0) throw DataError(path, "text file is empty; nothing to tokenize");
  if (is_jsonl_path(path) && compression_of(path) != Compression::None)
    return decompressed_size(path);
  return static_cast<uint64_t>(st.st_size);
}

namespace {

std::string read_range(const std::string& path, uint64_t begin, uint64_t end) {
  std::ifstream in(path, std::ios::binary);
  std::string s(end - begin, '\0');
  in.seekg(static_cast<std::streamoff>(begin));
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  if (static_cast<uint64_t>(in.gcount()) != s.size())
    throw DataError(path, "error while reading text file (did it shrink while being read?)");
  return s;
}

// The first byte of the file's validation part.
uint64_t split_offset(const std::string& path, uint64_t size, double val_fraction, CutRule rule) {
  const auto n_val = static_cast<uint64_t>(std::llround(static_cast<double>(size) * val_fraction));
  const uint64_t target = size - n_val;
  if (rule == CutRule::Anywhere || n_val == 0 || target == 0) return target;
  // Back to a boundary within the last MiB before the target (see io/text_cut.h).
  const uint64_t lo = target > (1u << 20) ? target - (1u << 20) : 0;
  // The window ends at the target byte itself: a cut p <= target needs text[p] (and for a
  // space boundary text[p + 1]) to decide.
  const std::string w = read_range(path, lo, target + 1);
  const size_t cut = last_cut(w, rule, 1);
  return lo + std::min<uint64_t>(cut, target - lo);
}

enum class Role { Train, Val };

struct Chunk {
  const std::string* path = nullptr;
  uint64_t offset = 0;  // of text[0] in the file
  uint64_t line = 0;    // JSON Lines: the line of the first document; 0 for a text file
  Role role = Role::Train;
  std::string text;
  // JSON Lines: where each document of `text` ends. Each is tokenized on its own, so that no
  // token spans two documents (as none spans two text files). Empty: `text` is one piece.
  std::vector<size_t> document_ends;
  bool ends_document = false;  // a text file: the last chunk of its training or validation part
  bool starts_document = false;  // a text file: the first chunk of its training or validation part
  std::vector<uint32_t> tokens;
  std::exception_ptr error;
  bool done = false;
};

// Tokenizes chunks on `threads` threads; the caller takes results in submission order.
class Workers {
 public:
  Workers(int threads, const Tokenizer& tok, std::optional<uint32_t> end_of_text)
      : tok_(tok), begin_of_text_(tok.begin_of_text()), end_of_text_(end_of_text) {
    // A thread the system refuses ends the started ones before the error goes on: a joinable
    // std::thread destroyed unjoined would abort, leaving the shards' .tmp files behind.
    // The threads hold SIGINT and SIGTERM back (they inherit this thread's mask while it is
    // held), so that the signals reach the thread that holds them back while it publishes
    // (io/prepare_outputs.h), not a tokenizing thread that would remove the outputs meanwhile.
    try {
      const StopSignalsHeld held;
      for (int t = 0; t < threads; ++t) pool_.emplace_back([this] { run(); });
    } catch (const std::system_error& e) {
      stop();
      throw std::invalid_argument("prepare: cannot start " + std::to_string(threads) +
                                " tokenizing threads (" + e.what() + "; give fewer with --threads)");
    }
  }
  ~Workers() { stop(); }
  void stop() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : pool_) t.join();
    pool_.clear();
  }
  void submit(Chunk* c) {
    {
      std::lock_guard<std::mutex> l(m_);
      queue_.push_back(c);
    }
    work_cv_.notify_one();
  }
  void wait(Chunk* c) {
    std::unique_lock<std::mutex> l(m_);
    done_cv_.wait(l, [&] { return c->done; });
  }

 private:
  void run() {
    for (;;) {
      Chunk* c;
      {
        std::unique_lock<std::mutex> l(m_);
        work_cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        c = queue_.front();
        queue_.pop_front();
      }
      try {
        encode(*c);
      } catch (...) {
        c->error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> l(m_);
        c->done = true;
      }
      done_cv_.notify_all();
    }
  }
  void encode(Chunk& c) const {
    if (!c.document_ends.empty()) {
      // A token covers at least one byte: room for every token without growing, then the
      // surplus (most of it, for a subword tokenizer) is given back.
      c.tokens.reserve(c.text.size() + 2 * c.document_ends.size());
      size_t begin = 0;
      for (const size_t end : c.document_ends) {
        // An empty text adds nothing, not even the end-of-text token: as no file would (an
        // empty text file is refused).
        if (end > begin) {
          if (begin_of_text_) c.tokens.push_back(*begin_of_text_);
          const std::vector<uint32_t> t = encode_piece(c, begin, end);
          c.tokens.insert(c.tokens.end(), t.begin(), t.end());
          if (end_of_text_) c.tokens.push_back(*end_of_text_);
        }
        begin = end;
      }
      c.tokens.shrink_to_fit();
    } else {
      c.tokens = encode_piece(c, 0, c.text.size());
      if (c.starts_document && begin_of_text_) c.tokens.insert(c.tokens.begin(), *begin_of_text_);
      if (c.ends_document && end_of_text_) c.tokens.push_back(*end_of_text_);
    }
    std::string().swap(c.text);
  }
  std::vector<uint32_t> encode_piece(const Chunk& c, size_t begin, size_t end) const {
    const std::string_view text(c.text.data() + begin, end - begin);
    // JSON Lines documents were checked line by line (io/jsonl_documents.h); the offsets of
    // a text file's bytes are what names them.
    const std::string where = c.line > 0 ? "the documents from line " + std::to_string(c.line)
                                         : "the text from byte offset " +
                                               std::to_string(c.offset + begin);
    if (!tok_.takes_any_bytes()) {
      const size_t bad = first_non_text_byte(text);
      if (bad < text.size())
        throw DataError(*c.path, describe_non_text_byte(text, bad) +
                                     (c.line > 0 ? " in " + where
                                                 : " at byte offset " +
                                                       std::to_string(c.offset + begin + bad)) +
                                     ": the " + tok_.kind() +
                                     " tokenizer takes UTF-8 text without NUL bytes (binary "
                                     "files, UTF-16 text: convert or leave them out; "
                                     "--tokenizer bytes takes any bytes)");
    }
    try {
      return tok_.encode(text);
    } catch (const DataError& e) {  // names the tokenizer's file; say which text, too
      throw DataError(*c.path, "tokenizing " + where + ": " + e.what());
    }
  }

  const Tokenizer& tok_;
  // The token HF's post-processor puts before every text (Llama 3's <|begin_of_text|>): before
  // every document, as HF's tokenizer would encode each.
  std::optional<uint32_t> begin_of_text_;
  std::optional<uint32_t> end_of_text_;
  std::mutex m_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Chunk*> queue_;
  bool stop_ = false;
  std::vector<std::thread> pool_;
};

// "prepare: 120.0 / 512.0 MB (23%), 48.1 MB/s": rewritten in place on a terminal, a line
// every 10 s otherwise (logs).
class Progress {
 public:
  Progress(bool on, uint64_t total) : on_(on), tty_(::isatty(2) == 1), total_(total) {}
  void update(uint64_t done, bool last = false) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    const double since = std::chrono::duration<double>(now - printed_).count();
    if (!last && since < (tty_ ? 0.5 : 10.0)) return;
    printed_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "%sprepare: %.1f / %.1f MB (%.0f%%), %.1f MB/s%s", tty_ ? "\r" : "",
                 done / 1e6, total_ / 1e6, total_ ? 100.0 * done / total_ : 100.0,
                 s > 0 ? done / 1e6 / s : 0.0, tty_ && !last ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  bool on_, tty_;
  uint64_t total_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), printed_;
};

// Writes the tokenizer beside the shards as `<name>.tmp`, published with them
// (PrepareOutputs::publish).
void write_tokenizer_temporary(const Tokenizer& tok, const std::string& path) {
  const std::string tmp = path + ".tmp";
  try {
    tok.save(tmp);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

// Appends the head of `text` to train and its last val_fraction to val (rounded to a whole
// token). The synthetic corpus is generated in memory anyway.
void split_into(std::string_view text, double val_fraction, std::vector<uint32_t>& train,
                std::vector<uint32_t>& val) {
  const size_t n_val =
      static_cast<size_t>(std::llround(static_cast<double>(text.size()) * val_fraction));
  const std::vector<uint32_t> tokens = tokenize_bytes(text);
  const size_t n_train = tokens.size() - n_val;
  train.insert(train.end(), tokens.begin(), tokens.begin() + n_train);
  val.insert(val.end(), tokens.begin() + n_train, tokens.end());
}


// The bad lines of JSON Lines inputs: each named on stderr while few, an error once more than
// the user allowed.
class BadLines {
 public:
  explicit BadLines(int64_t allowed) : allowed_(allowed) {}
  void add(const std::string& path, const JsonlLine& line) {
    ++count_;
    const std::string where = path + ": line " + std::to_string(line.number) + ": " + line.text;
    if (count_ > allowed_)
      throw DataError(path, "line " + std::to_string(line.number) + ": " + line.text + "; " +
                                std::to_string(count_) + " bad line(s) so far, more than "
                                "--max-bad-lines " + std::to_string(allowed_) +
                                " allows (fix or drop the lines, or allow more with "
                                "--max-bad-lines N)");
    if (count_ <= kNamed)
      std::fprintf(stderr, "meshtrain: warning: %s (line skipped)\n", where.c_str());
    else if (count_ == kNamed + 1)
      std::fprintf(stderr, "meshtrain: warning: more bad lines; only their count follows\n");
  }
  void summarize() const {
    if (count_ > 0)
      std::fprintf(stderr, "meshtrain: warning: skipped %lld bad line(s) (--max-bad-lines %lld)\n",
                   static_cast<long long>(count_), static_cast<long long>(allowed_));
  }
  int64_t count() const { return count_; }

 private:
  static constexpr int64_t kNamed = 10;
  int64_t allowed_, count_ = 0;
};

// Feeds the documents of one JSON Lines file to `submit` as chunks of whole documents, about
// `chunk` bytes each, in order; `size` is its decompressed size (check_text_file).
template <typename Submit>
void feed_jsonl(const std::string& path, uint64_t size, const PrepareOptions& opt,
                const Tokenizer& tok, size_t chunk, BadLines& bad_lines, Submit&& submit) {
  // Whole documents go to validation: those whose lines start in the last val_fraction.
  const uint64_t split =
      size - static_cast<uint64_t>(std::llround(static_cast<double>(size) * opt.val_fraction));
  JsonlDocuments documents(path, opt.text_field, !tok.takes_any_bytes(), opt.max_line_bytes);
  std::unique_ptr<Chunk> c;
  uint64_t document_count = 0, bad_count = 0;
  uint64_t read = 0, submitted = 0;  // decompressed bytes: for the progress line
  auto flush = [&] {
    if (c) submit(std::move(c), read - submitted);
    submitted = read;
    c.reset();
  };
  for (;;) {
    JsonlLine line = documents.next();
    if (line.kind == JsonlLine::Kind::End) break;
    read = line.offset + line.bytes;
    if (line.kind == JsonlLine::Kind::Bad) {
      bad_lines.add(path, line);
      ++bad_count;
      continue;
    }
    const Role role = line.offset < split ? Role::Train : Role::Val;
    // A chunk holds whole documents, at most `chunk` bytes of them unless one alone is more.
    if (c && (c->role != role || c->text.size() + line.text.size() > chunk)) flush();
    if (!c) {
      c = std::make_unique<Chunk>();
      c->path = &path;
      c->offset = line.offset;
      c->line = line.number;
      c->role = role;
      // Appending documents one by one would double the capacity past the chunk size.
      c->text.reserve(std::max(chunk, line.text.size()));
    }
    c->text += line.text;
    c->document_ends.push_back(c->text.size());
    ++document_count;
  }
  // Blank lines alone made empty shards with exit 0: a corpus that is not what its user thinks.
  if (document_count == 0)
    throw DataError(path, "holds no document: its " + std::to_string(documents.lines()) +
                              " line(s) are all blank" +
                              (bad_count > 0 ? " or bad (skipped)" : "") +
                              " (JSON Lines holds one object per line, e.g. {\"" +
                              opt.text_field + "\": \"...\"})");
  read = size;
  flush();
}

// A text file in chunks of about `chunk` bytes, its training part then its validation part
// (split_offset), each chunk cut where `rule` allows and handed to `submit`.
template <typename Submit>
void feed_text_file(const std::string& path, uint64_t size, double val_fraction, CutRule rule,
                    size_t chunk, Submit& submit) {
  const uint64_t split = split_offset(path, size, val_fraction, rule);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, std::string("cannot open text file: ") + std::strerror(errno));
  for (const auto& [role, begin, end] :
       {std::tuple{Role::Train, uint64_t{0}, split}, std::tuple{Role::Val, split, size}}) {
    std::string carry;
    uint64_t read_to = begin, carry_at = begin;
    while (read_to < end || !carry.empty()) {
      const uint64_t want = std::min<uint64_t>(chunk > carry.size() ? chunk - carry.size() : 0,
                                               end - read_to);
      if (want > 0) {
        const size_t old = carry.size();
        carry.resize(old + want);
        in.read(carry.data() + old, static_cast<std::streamsize>(want));
        if (static_cast<uint64_t>(in.gcount()) != want)
          throw DataError(path, "error while reading text file (did it shrink while being "
                                "read?)");
        read_to += want;
      }
      auto c = std::make_unique<Chunk>();
      c->path = &path;
      c->offset = carry_at;
      c->role = role;
      const size_t cut = read_to == end ? carry.size() : last_cut(carry, rule, carry.size() / 2);
      c->text = carry.substr(0, cut);
      carry.erase(0, cut);
      carry_at += cut;
      c->ends_document = read_to == end && carry.empty();
      c->starts_document = c->offset == begin;
      submit(std::move(c), cut);
    }
  }
}

// Each input's size, checked readable text; a text file (tokenized in pieces: chunks, the
// validation split) only for a tokenizer that gives the pieces what it gives the whole. JSON
// Lines documents go whole.
std::vector<uint64_t> checked_input_sizes(const std::vector<std::string>& inputs, const Tokenizer& tok) {
  std::vector<uint64_t> sizes;
  for (const std::string& path : inputs) {
    sizes.push_back(check_text_file(path));
    if (!is_jsonl_path(path) && !tok.encodes_pieces_alike())
      throw DataError(path, "is a text file, which prepare tokenizes in pieces, and the " +
                                tok.kind() + " tokenizer looks at a text as a whole (its "
                                "tokenizer.json has a normalizer Strip, Prepend or Replace, "
                                "ByteLevel's add_prefix_space, or an added token with rstrip or "
                                "whitespace); give the text as JSON Lines, one document a line");
  }
  return sizes;
}

}  // namespace

PrepareResult prepare_text_files(const std::vector<std::string>& inputs,
                                 const std::string& out_prefix, const Tokenizer& tok,
                                 const PrepareOptions& opt) {
  check_fraction(opt.val_fraction);
  check_out_prefix(out_prefix);
  // Before anything is written: a thread that cannot be started would abort with .tmp shards.
  if (opt.threads > kMaxThreads)
    throw std::invalid_argument("prepare: " + std::to_string(opt.threads) + " threads (expected "
                                "from 1 to " + std::to_string(kMaxThreads) + ")");
  if (inputs.empty()) throw std::invalid_argument("prepare: no input text files given");
  const std::vector<std::string> outputs =
      prepare_output_names(out_prefix, opt.val_fraction, tok.file_suffix());
  std::vector<std::string> read_files = inputs;
  read_files.insert(read_files.end(), opt.tokenizer_files.begin(), opt.tokenizer_files.end());
  // Before the inputs' checks, which decompress every compressed one.
  check_prepare_outputs(outputs, read_files, opt.existing);
  const std::vector<uint64_t> sizes = checked_input_sizes(inputs, tok);
  uint64_t total = 0;
  for (uint64_t size : sizes) total += size;
  make_parent_directory(out_prefix);

  const int threads = opt.threads > 0 ? opt.threads : available_cores();
  // At most 2 chunks per thread in flight: about 8 MiB of text, whatever the corpus.
  const size_t in_flight = 2 * static_cast<size_t>(threads);
  const size_t chunk = opt.chunk_bytes > 0
                           ? opt.chunk_bytes
                           : std::clamp<size_t>((8u << 20) / in_flight, 64u << 10, 2u << 20);
  const CutRule rule = tok.takes_any_bytes() ? CutRule::Anywhere : CutRule::TextBoundary;

  PrepareResult r;
  r.vocab_size = tok.vocab_size();
  r.train_path = outputs[0];
  const bool with_val = opt.val_fraction > 0;
  if (with_val) r.val_path = outputs[1];
  // Before the writers: its signal handlers must outlive their temporaries.
  PrepareOutputs files(outputs);
  TokenShardWriter train(r.train_path, r.vocab_size);
  std::optional<TokenShardWriter> val;
  if (with_val) val.emplace(r.val_path, r.vocab_size);

  std::deque<std::unique_ptr<Chunk>> pending;  // declared before the workers: outlives them
  if (opt.end_of_text && *opt.end_of_text >= tok.vocab_size())
    throw std::invalid_argument("prepare: end-of-text token " + std::to_string(*opt.end_of_text) +
                                " lies outside the vocabulary of " +
                                std::to_string(tok.vocab_size()));
  Workers workers(threads, tok, opt.end_of_text);
  Progress progress(opt.progress, total);
  uint64_t done = 0;
  auto write_front = [&] {
    Chunk* c = pending.front().get();
    workers.wait(c);
    if (c->error) std::rethrow_exception(c->error);
    (c->role == Role::Train ? train : *val).append(c->tokens.data(), c->tokens.size());
    pending.pop_front();
  };
  auto submit = [&](std::unique_ptr<Chunk> c, uint64_t bytes) {
    while (pending.size() >= in_flight) write_front();
    workers.submit(c.get());
    pending.push_back(std::move(c));
    done += bytes;
    progress.update(done);
  };

  BadLines bad_lines(opt.max_bad_lines);
  for (size_t f = 0; f < inputs.size(); ++f) {
    const std::string& path = inputs[f];
    if (is_jsonl_path(path)) {
      feed_jsonl(path, sizes[f], opt, tok, chunk, bad_lines, submit);
      continue;
    }
    feed_text_file(path, sizes[f], opt.val_fraction, rule, chunk, submit);
  }
  while (!pending.empty()) write_front();
  progress.update(total, true);
  bad_lines.summarize();
  r.bad_lines = bad_lines.count();
  train.seal();
  if (val) val->seal();
  if (!tok.file_suffix().empty()) {
    r.tokenizer_path = outputs.back();
    write_tokenizer_temporary(tok, r.tokenizer_path);
  }
  // Every output renamed, or none (the writers' own clean-up then finds no .tmp to remove).
  files.publish();
  r.train_tokens = train.tokens();
  if (val) r.val_tokens = val->tokens();
  return r;
}

int available_cores() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

PrepareResult prepare_text_files(const std::vector<std::string>& inputs,
                                 const std::string& out_prefix, double val_fraction) {
  PrepareOptions opt;
  opt.val_fraction = val_fraction;
  return prepare_text_files(inputs, out_prefix, *make_byte_tokenizer(), opt);
}

PrepareResult prepare_synthetic(uint64_t seed, size_t bytes, const std::string& out_prefix,
                                double val_fraction, ExistingOutputs existing) {
  check_fraction(val_fraction);
  check_out_prefix(out_prefix);
  const std::vector<std::string> outputs = prepare_output_names(out_prefix, val_fraction, "");
  check_prepare_outputs(outputs, {}, existing);
  std::vector<uint32_t> train, val;
  split_into(synthetic_text(seed, bytes), val_fraction, train, val);
  make_parent_directory(out_prefix);
  PrepareResult r;
  r.vocab_size = kByteVocabSize;
  r.train_path = outputs[0];
  PrepareOutputs files(outputs);
  // Both sealed before either is published: a failure leaves neither.
  std::vector<std::unique_ptr<TokenShardWriter>> writers;
  const std::vector<uint32_t>* parts[] = {&train, &val};
  for (size_t i = 0; i < outputs.size(); ++i) {
    writers.push_back(std::make_unique<TokenShardWriter>(outputs[i], kByteVocabSize));
    writers.back()->append(parts[i]->data(), parts[i]->size());
    writers.back()->seal();
  }
  files.publish();
  r.train_tokens = static_cast<int64_t>(train.size());
  if (val_fraction > 0) {
    r.val_path = outputs[1];
    r.val_tokens = static_cast<int64_t>(val.size());
  }
  return r;
}

std::vector<std::string> prepare_output_names(const std::string& out_prefix, double val_fraction,
                                              const std::string& tokenizer_suffix) {
  std::vector<std::string> names{out_prefix + "_train.bin"};
  if (val_fraction > 0) names.push_back(out_prefix + "_val.bin");
  if (!tokenizer_suffix.empty()) names.push_back(out_prefix + "_tokenizer" + tokenizer_suffix);
  return names;
}

}  // namespace meshtrain
