#pragma once
// Which page of docs/ explains a refusal or a command. Hundreds of messages name a deck key, a
// file or a command; rather than each carrying its own link, one table maps what a message
// names to the page that explains it, and the places that print errors (mpi_session.cpp,
// prepare, inspect, main) add the page after the message. --help names the same pages as each
// sub-command's footer.

#include <string>
#include <vector>

namespace meshtrain {

// The page (e.g. "docs/checkpoints.md") that explains a message: the first topic of the table
// whose words the message contains; `fallback` when none does.
std::string docs_page_for(const std::string& message,
                          const std::string& fallback = "docs/troubleshooting.md");

// The line printed after an error: "meshtrain: more in PAGE" (no "error:", so that a message
// still reads as printed once).
std::string docs_pointer_line(const std::string& page);

// docs_pointer_line(docs_page_for(message, fallback)) on stderr.
void print_docs_pointer(const std::string& message,
                        const std::string& fallback = "docs/troubleshooting.md");

// The --help footer of a sub-command: the pages that explain it.
std::string docs_footer(const std::string& subcommand);

// Every page the table and the footers name, for the test that each exists.
std::vector<std::string> docs_pages_named();

}  // namespace meshtrain
