#pragma once
// What every reader of TOML files (the deck, machine profiles) shares: parsing with an error that
// names file:line, and how error messages show a value the user wrote: its kind ("an integer")
// and its text as written.

#include <toml++/toml.h>

#include <functional>
#include <string>

namespace meshtrain {

// The document in `text`, read from `path`; a syntax error throws DeckError
// "<path>:<line>: not valid TOML: <what toml++ says>".
toml::table parse_toml(const std::string& text, const std::string& path);

// "a string", "an integer", "a float", "a boolean", "an array", "a table", "a date/time".
std::string toml_type_of(const toml::node& n);
// The value as the user wrote it: strings quoted, numbers in their shortest exact form (not
// toml++'s 17 digits), arrays element by element, tables as {...}.
std::string toml_repr(const toml::node& n);
// The text with control characters (NUL, newline, ...) written as \uXXXX, so that a message
// shows them instead of being cut at a NUL or broken across lines.
std::string escape_control(const std::string& text);
// The location prefix of a message about the value at `source`, named `dotted_name`.
using ValueOrigin =
    std::function<std::string(const toml::source_region& source, const std::string& dotted_name)>;
// Refuses (DeckError) a string value or key anywhere in `root` that holds a NUL character:
// open(2) and every C string would see it cut there (data.train = "a.bin\u0000.evil" named
// a.bin). `where(source, dotted name)` is the message's location prefix ("deck.toml:3",
// "--set ...").
void refuse_nul_characters(const toml::table& root,
                           const ValueOrigin& where);
// Shortest text that reads back as the same double (std::to_chars' guarantee); TOML accepts
// both forms it writes ("64", "3.35e+12").
std::string exact_number(double v);

}  // namespace meshtrain
