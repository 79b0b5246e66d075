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
  BenchReport() = default;
  // A report that keeps its rows but prints nothing (a measurement made for another purpose,
  // e.g. train's start-up calibration).
  static BenchReport quiet() {
    BenchReport r;
    r.print_ = false;
    return r;
  }
  // Starts a table with these value columns (after `name`, before `wrong`).
  void columns(std::vector<std::string> columns);
  void header(const std::string& line);  // printed as "# line"
  void row(const std::string& name, const std::vector<double>& values, int wrong);
  int wrong() const { return wrong_; }
  // Writes {"header": [...], "columns": [...], "rows": [{...}]}; throws DataError naming the
  // path and the reason (e.g. a full disk) when any byte cannot be written.
  void write_json(const std::string& path) const;

 private:
  std::vector<std::string> columns_;
  std::vector<std::string> headers_;
  struct Row {
    std::string name;
    std::vector<std::string> columns;
    std::vector<double> values;
    int wrong;
  };
  std::vector<Row> rows_;
  int wrong_ = 0;
  bool printed_columns_ = false;
  bool print_ = true;
};

}  // namespace meshtrain
