#pragma once
// A generated English-like corpus, so that the default deck trains with no download and its
// validation loss visibly falls. This file is the generator only; turning text into tokens is
// io/byte_tokenizer.h and into shards io/prepare.h.
//
// The text comes from a seeded probabilistic grammar over a few hundred words (animals and
// people, things, places, names, verbs with their -s and past forms, adjectives, adverbs) in
// paragraphs of five kinds: stories, dialogues, descriptions, lists and counting. It has
// structure at several ranges for a small model to learn:
//   - spelling and word shapes (byte level), a/an before vowels, capitals after a full stop;
//   - subject-verb agreement ("the dog sees", "the dogs see", "I have one cat", "two cats");
//   - facts that hold across the whole corpus (each town's kind, river or hills, and what it
//     is known for; each name's he/she);
//   - references inside a paragraph: a story introduces a character by name and home town,
//     later sentences use the name and the matching pronoun, and the ending returns to both;
//     an answer repeats the thing its question asked about; list items are numbered 1, 2,
//     3, ... and the closing line states the count; a character who gives one thing away has
//     one fewer left.
//
// The result is a pure function of (seed, bytes), and a prefix of the text for more bytes.
// Only printable ASCII and '\n' occur.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace meshtrain {

std::string synthetic_text(uint64_t seed, size_t bytes);

// The same, asking keep_going() about every megabyte: generating gigabytes takes minutes, and a
// job told to stop meanwhile (train/stop_request.h) must not wait for it. Returns the text so
// far (shorter than `bytes`) when keep_going() says false.
std::string synthetic_text(uint64_t seed, size_t bytes, const std::function<bool()>& keep_going);

}  // namespace meshtrain
