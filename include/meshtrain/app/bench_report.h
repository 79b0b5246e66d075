#pragma once
// The one output format of every benchmark: '#' header lines, then fixed columns
//   name  <suite-specific columns>  ratio  wrong
// where `ratio` is the achieved figure over this machine's own ceiling measured in the same run
// and `wrong` counts failed result checks. A copy goes to JSON when asked; a non-zero `wrong`
// anywhere makes the command fail.

#include <string>
#include <vector>

namespace meshtrain {

class BenchReport {
 public:
  // print: false on all MPI ranks but 0, so a multi-rank suite reports once.
  explicit BenchReport(std::vector<std::string> columns, bool print = true);
  void header(const std::string& line);  // printed as "# line"
  // Starts a table with other columns (a suite whose figures are not the first suite's).
  void table(std::vector<std::string> columns);
  void row(const std::string& name, const std::vector<double>& values, int wrong);
  int wrong() const { return wrong_; }
  // Writes {"header": [...], "columns": [...], "rows": [{...}]}; throws on I/O failure.
  void write_json(const std::string& path) const;

 private:
  std::vector<std::string> columns_;
  std::vector<std::string> headers_;
  struct Row {
    std::vector<std::string> columns;
    std::string name;
    std::vector<double> values;
    int wrong;
  };
  std::vector<Row> rows_;
  int wrong_ = 0;
  bool printed_columns_ = false;
  bool print_ = true;
};

}  // namespace meshtrain
