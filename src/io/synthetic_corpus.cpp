#include "meshtrain/io/synthetic_corpus.h"

#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "meshtrain/tensor/philox.h"

namespace meshtrain {

namespace {

using sv = std::string_view;

struct Noun {
  sv one, many;
};
struct Verb {
  sv base, third, past;  // "see" (I, you, we, they, plural subjects), "sees", "saw"
};

// The lexicon. Lists are ordered roughly by how common a word should be: draws are skewed
// towards the front (see Rng::skewed), which lowers the entropy a model has to pay for while
// keeping every word in use. Every word is lowercase ASCII.

// People who can have a job in a story: gender-neutral, so any name fits.
constexpr Noun kRoles[] = {
    {"farmer", "farmers"},     {"baker", "bakers"},       {"teacher", "teachers"},
    {"sailor", "sailors"},     {"doctor", "doctors"},     {"painter", "painters"},
    {"builder", "builders"},   {"hunter", "hunters"},     {"singer", "singers"},
    {"merchant", "merchants"}, {"gardener", "gardeners"}, {"writer", "writers"},
};
// Subjects of verbs: animals and people.
constexpr Noun kCreatures[] = {
    {"dog", "dogs"},       {"cat", "cats"},       {"bird", "birds"},     {"child", "children"},
    {"horse", "horses"},   {"fox", "foxes"},      {"man", "men"},        {"woman", "women"},
    {"mouse", "mice"},     {"rabbit", "rabbits"}, {"boy", "boys"},       {"girl", "girls"},
    {"owl", "owls"},       {"frog", "frogs"},     {"wolf", "wolves"},    {"bear", "bears"},
    {"duck", "ducks"},     {"goat", "goats"},     {"king", "kings"},     {"queen", "queens"},
    {"farmer", "farmers"}, {"baker", "bakers"},   {"sailor", "sailors"}, {"teacher", "teachers"},
};
// Objects.
constexpr Noun kThings[] = {
    {"ball", "balls"},     {"book", "books"},         {"cup", "cups"},
    {"apple", "apples"},   {"box", "boxes"},          {"hat", "hats"},
    {"key", "keys"},       {"boat", "boats"},         {"cake", "cakes"},
    {"lamp", "lamps"},     {"letter", "letters"},     {"coat", "coats"},
    {"egg", "eggs"},       {"flower", "flowers"},     {"stone", "stones"},
    {"basket", "baskets"}, {"chair", "chairs"},       {"table", "tables"},
    {"bell", "bells"},     {"candle", "candles"},     {"map", "maps"},
    {"coin", "coins"},     {"ring", "rings"},         {"shoe", "shoes"},
    {"kite", "kites"},     {"drum", "drums"},         {"pie", "pies"},
    {"shell", "shells"},   {"rope", "ropes"},         {"loaf", "loaves"},
    {"knife", "knives"},   {"brush", "brushes"},      {"blanket", "blankets"},
    {"bottle", "bottles"}, {"pencil", "pencils"},     {"clock", "clocks"},
    {"mirror", "mirrors"}, {"pillow", "pillows"},     {"spoon", "spoons"},
    {"wheel", "wheels"},   {"feather", "feathers"},   {"jar", "jars"},
    {"toy", "toys"},       {"umbrella", "umbrellas"},
};
constexpr sv kLocations[] = {
    "garden", "kitchen", "market", "forest", "park",   "school", "library", "field",
    "barn",   "harbor",  "square", "attic",  "cellar", "shop",   "meadow",  "bakery",
};
constexpr sv kPrepositions[] = {"in", "near", "under", "behind", "beside", "by"};
constexpr Verb kTransitive[] = {
    {"see", "sees", "saw"},         {"find", "finds", "found"},
    {"like", "likes", "liked"},     {"carry", "carries", "carried"},
    {"want", "wants", "wanted"},    {"take", "takes", "took"},
    {"make", "makes", "made"},      {"watch", "watches", "watched"},
    {"hold", "holds", "held"},      {"bring", "brings", "brought"},
    {"buy", "buys", "bought"},      {"sell", "sells", "sold"},
    {"open", "opens", "opened"},    {"paint", "paints", "painted"},
    {"clean", "cleans", "cleaned"}, {"fix", "fixes", "fixed"},
    {"hide", "hides", "hid"},       {"keep", "keeps", "kept"},
    {"lose", "loses", "lost"},      {"love", "loves", "loved"},
    {"need", "needs", "needed"},    {"push", "pushes", "pushed"},
    {"draw", "draws", "drew"},      {"build", "builds", "built"},
};
constexpr Verb kIntransitive[] = {
    {"sleep", "sleeps", "slept"},  {"run", "runs", "ran"},         {"sing", "sings", "sang"},
    {"walk", "walks", "walked"},   {"laugh", "laughs", "laughed"}, {"wait", "waits", "waited"},
    {"dance", "dances", "danced"}, {"swim", "swims", "swam"},      {"rest", "rests", "rested"},
    {"play", "plays", "played"},   {"work", "works", "worked"},    {"jump", "jumps", "jumped"},
    {"sit", "sits", "sat"},        {"cry", "cries", "cried"},      {"smile", "smiles", "smiled"},
};
constexpr sv kAdjectives[] = {
    "red",    "big",    "small",  "old",     "new",   "little", "happy",  "blue",
    "green",  "long",   "quiet",  "warm",    "cold",  "bright", "dark",   "young",
    "tall",   "soft",   "heavy",  "round",   "sweet", "clean",  "kind",   "brave",
    "clever", "gentle", "yellow", "strange", "tiny",  "golden", "silver", "wooden",
    "busy",   "lazy",   "sleepy", "wild",    "loud",  "sad",    "empty",  "ancient",
};
constexpr sv kAdverbs[] = {
    "slowly", "quickly", "quietly", "happily", "softly", "together", "again", "all day",
};
constexpr sv kHeNames[] = {"Tom",  "Sam",   "Ben",    "Jack",  "Leo",   "Max",  "Oliver", "Henry",
                           "Hugo", "Felix", "Arthur", "Peter", "Oscar", "Noah", "Simon"};
constexpr sv kSheNames[] = {"Anna",  "Lily", "Emma", "Rose", "Clara", "Mia",    "Lucy", "Alice",
                            "Grace", "Ella", "Ivy",  "Nora", "Ruby",  "Sophie", "Julia"};
constexpr sv kTowns[] = {"Ashford",   "Bramble",   "Cobham",    "Dunmore",  "Elmwood",
                         "Fairview",  "Glenrock",  "Hillcrest", "Kingsley", "Larkfield",
                         "Millbrook", "Northwick", "Oakdale",   "Pinewood", "Redhill",
                         "Stonebury", "Thornton",  "Westmere",  "Willowby", "Yarrow"};
constexpr sv kTownKinds[] = {"village", "town", "city"};
constexpr sv kFeatures[] = {"river", "sea", "hills", "forest", "lake", "mountains"};
constexpr sv kNumbers[] = {"zero",  "one",   "two",  "three", "four",   "five",  "six",
                           "seven", "eight", "nine", "ten",   "eleven", "twelve"};

// splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA
// 2014): the corpus needs millions of draws, and Philox per draw would cost most of the
// generation time; Philox only derives the starting state from the seed.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream) {
    const Philox::Block b = Philox(seed, "synthetic_corpus")(stream, Philox::Stream::Data);
    state_ = (static_cast<uint64_t>(b[1]) << 32) | b[0];
  }
  uint64_t next() { return mix64(state_ += 0x9E3779B97F4A7C15ull); }
  // Uniform in [0, n), n < 2^32 (multiply-shift; the bias is far below anything visible).
  size_t below(size_t n) { return static_cast<size_t>(((next() >> 32) * n) >> 32); }
  // In [0, n), with density falling like 1/sqrt(x): early entries are common, late ones rare.
  size_t skewed(size_t n) {
    const uint64_t u = next() >> 40;  // 24 bits
    return static_cast<size_t>((((u * u) >> 24) * n) >> 24);
  }
  bool chance(int percent) { return below(100) < static_cast<size_t>(percent); }

 private:
  uint64_t state_;
};

template <class T, size_t N>
const T& pick(Rng& rng, const T (&a)[N]) {
  return a[rng.skewed(N)];
}
template <class T, size_t N>
const T& pick_uniform(Rng& rng, const T (&a)[N]) {
  return a[rng.below(N)];
}

struct Person {
  sv name;
  bool she;
  sv he() const { return she ? "she" : "he"; }
  sv his() const { return she ? "her" : "his"; }
};

// Facts that hold across the whole corpus of one seed.
struct Town {
  sv name, kind, feature;
  const Noun* known_for;
};

std::vector<Town> make_world(uint64_t seed) {
  Rng rng(seed, 1);
  std::vector<Town> towns;
  for (sv name : kTowns) {
    towns.push_back({name, pick_uniform(rng, kTownKinds), pick_uniform(rng, kFeatures),
                     &pick_uniform(rng, kThings)});
  }
  return towns;
}

// Words joined by single spaces; empty pieces are skipped (an optional adjective).
std::string join(std::initializer_list<sv> words) {
  std::string s;
  for (sv w : words) {
    if (w.empty()) continue;
    if (!s.empty()) s += ' ';
    s += w;
  }
  return s;
}

// Capitalises the first letter (after any opening quote).
std::string cap(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') {
      c = static_cast<char>(c - 'a' + 'A');
      break;
    }
    if (c >= 'A' && c <= 'Z') break;
  }
  return s;
}

sv article(sv next_word) {
  const char c = next_word.empty() ? 'x' : next_word[0];
  return (c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u') ? "an" : "a";
}

class Writer {
 public:
  Writer(std::string& out, uint64_t seed) : out_(out), rng_(seed, 0), towns_(make_world(seed)) {}

  void paragraph() {
    const size_t r = rng_.below(100);
    if (r < 35) {
      story();
    } else if (r < 60) {
      description();
    } else if (r < 80) {
      dialogue();
    } else if (r < 90) {
      list();
    } else {
      counting();
    }
    out_ += "\n\n";
  }

 private:
  Person person() {
    const bool she = rng_.chance(50);
    return {she ? pick(rng_, kSheNames) : pick(rng_, kHeNames), she};
  }
  Person other_than(const Person& p) {
    for (;;) {
      Person q = person();
      if (q.name != p.name) return q;
    }
  }
  const Town& town() { return towns_[rng_.skewed(towns_.size())]; }
  sv adjective(int percent) { return rng_.chance(percent) ? pick(rng_, kAdjectives) : sv{}; }

  // "the old cup", "an apple", "these keys", "three red coats".
  std::string noun_phrase(const Noun& n, bool plural) {
    const sv adj = adjective(35);
    const sv noun = plural ? n.many : n.one;
    const size_t r = rng_.below(10);
    sv det;
    if (!plural) {
      det = r < 5 ? sv("the") : r < 8 ? article(adj.empty() ? noun : adj) : r < 9 ? "this" : "that";
    } else {
      det = r < 4   ? sv("the")
            : r < 6 ? "some"
            : r < 7 ? "many"
            : r < 8 ? "these"
                    : kNumbers[2 + rng_.below(8)];
    }
    return join({det, adj, noun});
  }
  std::string thing(bool plural) { return noun_phrase(pick(rng_, kThings), plural); }
  std::string place_phrase() {
    return join({pick(rng_, kPrepositions), "the", pick(rng_, kLocations)});
  }
  void sentence(const std::string& s, sv end = ".") {
    if (!out_.empty() && out_.back() != '\n') out_ += ' ';
    out_ += cap(s);
    out_ += end;
  }

  // A character is introduced by name and home town; later sentences refer back to both,
  // with the pronoun that matches the name.
  void story() {
    const Person p = person();
    const Town& t = town();
    const sv adj = adjective(60);
    const sv role = pick(rng_, kRoles).one;
    sentence(join({"once upon a time, there was", article(adj.empty() ? role : adj), adj, role,
                   "named", p.name}));
    sentence(
        join({p.he(), "lived in", std::string(t.name) + ",", "a", t.kind, "by the", t.feature}));
    const int body = 3 + static_cast<int>(rng_.below(4));
    bool gave = false;
    for (int i = 0; i < body; ++i) {
      const sv who = rng_.chance(50) ? p.name : p.he();
      switch (rng_.below(6)) {
        case 0:
          sentence(
              join({"one day,", p.name, pick(rng_, kTransitive).past, thing(rng_.chance(30))}));
          break;
        case 1:
          sentence(
              join({who, pick(rng_, kTransitive).past, thing(rng_.chance(30)), place_phrase()}));
          break;
        case 2:
          sentence(join({p.name, "said, \"I", pick(rng_, kTransitive).base,
                         thing(rng_.chance(40)) + ".\""}),
                   "");  // the quote closes the sentence
          break;
        case 3:
          sentence(join({"every morning,", who, pick(rng_, kIntransitive).third,
                         pick(rng_, kAdverbs), "in the", pick(rng_, kLocations)}));
          break;
        case 4: {
          if (gave) {
            sentence(join({who, "was very", pick(rng_, kAdjectives)}));
            break;
          }
          // One fewer after giving one away: arithmetic a model can pick up from context.
          gave = true;
          const size_t n = 2 + rng_.below(8);
          const Noun& n_of = pick(rng_, kThings);
          sentence(join({who, "had", kNumbers[n], n_of.many}));
          sentence(join({p.he(), "gave one to", std::string(other_than(p).name) + ",", "so", p.he(),
                         "had", kNumbers[n - 1], n == 2 ? n_of.one : n_of.many, "left"}));
          break;
        }
        default:
          sentence(join({p.his(), "friend", other_than(p).name, pick(rng_, kTransitive).past,
                         thing(rng_.chance(30))}));
          break;
      }
    }
    switch (rng_.below(3)) {
      case 0:
        sentence(join({"in the end,", p.name, "went back to", t.name, "and was happy again"}));
        break;
      case 1:
        sentence(join({p.name, "never left", t.name, "again"}));
        break;
      default:
        sentence(join({"and that is the story of", p.name, "from", t.name}));
        break;
    }
  }

  // Present tense about one town: agreement of subject and verb, and the town's fixed facts.
  void description() {
    const Town& t = town();
    sentence(join({t.name, "is a", t.kind, "by the", t.feature}));
    const int n = 2 + static_cast<int>(rng_.below(4));
    for (int i = 0; i < n; ++i) {
      const bool plural = rng_.chance(45);
      const Noun& c = pick(rng_, kCreatures);
      switch (rng_.below(5)) {
        case 0: {
          const Verb& v = pick(rng_, kTransitive);
          sentence(
              join({noun_phrase(c, plural), plural ? v.base : v.third, thing(rng_.chance(40))}));
          break;
        }
        case 1: {
          const Verb& v = pick(rng_, kIntransitive);
          sentence(join({noun_phrase(c, plural), plural ? v.base : v.third, pick(rng_, kAdverbs)}));
          break;
        }
        case 2: {
          const std::string what = thing(plural);
          sentence(join({"in", t.name, plural ? "there are" : "there is", what, place_phrase()}));
          break;
        }
        case 3:
          sentence(join(
              {"the", plural ? c.many : c.one, plural ? "are" : "is", pick(rng_, kAdjectives)}));
          break;
        default:
          sentence(join({t.name, "is known for its", t.known_for->many}));
          break;
      }
    }
  }

  // Each answer repeats what its question asked about; "one" takes the singular.
  void dialogue() {
    Person a = person(), b = other_than(a);
    const int turns = 2 + static_cast<int>(rng_.below(3));
    for (int i = 0; i < turns; ++i) {
      const Noun& n = pick(rng_, kThings);
      std::string q, ans;
      switch (rng_.below(3)) {
        case 0:
          q = join({"where is the", n.one}) + "?";
          ans = join({"the", n.one, "is", place_phrase()}) + ",";
          break;
        case 1:
          q = join({"do you like", n.many}) + "?";
          ans = rng_.chance(60) ? join({"yes, I like", n.many}) + ","
                                : join({"no, I do not like", n.many}) + ",";
          break;
        default: {
          const size_t k = 1 + rng_.below(9);
          q = join({"how many", n.many, "do you have"}) + "?";
          ans = join({"I have", kNumbers[k], k == 1 ? n.one : n.many}) + ",";
          break;
        }
      }
      out_ += "\"" + cap(q) + "\" asked " + std::string(a.name) + ".\n";
      out_ += "\"" + cap(ans) + "\" said " + std::string(b.name) + ".";
      if (i + 1 < turns) out_ += '\n';
      std::swap(a, b);
    }
  }

  // Numbered items counting up; the last line states the count.
  void list() {
    const Person p = person();
    sentence(join({p.name, "made a list of things to buy in", town().name}), ":");
    const size_t n = 3 + rng_.below(7);
    for (size_t i = 1; i <= n; ++i) {
      const sv adj = adjective(50);
      const sv noun = pick(rng_, kThings).one;
      out_ +=
          "\n" + std::to_string(i) + ". " + join({article(adj.empty() ? noun : adj), adj, noun});
    }
    out_ += '\n';
    sentence(join({"that is", kNumbers[n], "things in all"}));
  }

  void counting() {
    const Person p = person();
    const Noun& n = pick(rng_, kThings);
    const size_t k = 2 + rng_.below(11);
    std::string s = join({p.name, "counted the", n.many}) + ":";
    for (size_t i = 1; i <= k; ++i) {
      s += ' ';
      s += kNumbers[i];
      if (i < k) s += ',';
    }
    sentence(s);
    sentence(join({"there were", kNumbers[k], n.many, place_phrase()}));
  }

  std::string& out_;
  Rng rng_;
  std::vector<Town> towns_;
};

}  // namespace

std::string synthetic_text(uint64_t seed, size_t bytes) {
  return synthetic_text(seed, bytes, [] { return true; });
}

std::string synthetic_text(uint64_t seed, size_t bytes, const std::function<bool()>& keep_going) {
  std::string out;
  out.reserve(bytes + 4096);
  Writer w(out, seed);
  size_t ask_at = 1 << 20;
  while (out.size() < bytes) {
    if (out.size() >= ask_at) {
      if (!keep_going()) return out;
      ask_at = out.size() + (1 << 20);
    }
    w.paragraph();
  }
  // Cutting mid-paragraph keeps the text a prefix of any longer text from the same seed.
  out.resize(bytes);
  return out;
}

}  // namespace meshtrain
