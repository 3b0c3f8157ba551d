// The money machine (billing/machine/machine.hpp): its table against the statements that move a state, and
// docs/design.md's copy of the table against the code (the decisions against the table:
// machine_decisions_test.cpp).
//
// CHARGEGUARD_SOURCE_ROOT (set by meson) is the checkout whose src/billing, migrations and docs/design.md
// are read. CHARGEGUARD_WRITE_DESIGN_TABLE=1 rewrites the tables in docs/design.md from the code instead of
// comparing (then the comparison passes).
#include "billing/machine/machine.hpp"

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "billing/machine/settlement.hpp"

using namespace cg;
using namespace cg::billing;
namespace fs = std::filesystem;

namespace {

fs::path source_root() {
    const char* v = std::getenv("CHARGEGUARD_SOURCE_ROOT");
    BOOST_REQUIRE_MESSAGE(v && *v, "CHARGEGUARD_SOURCE_ROOT is not set (meson sets it)");
    return v;
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    BOOST_REQUIRE_MESSAGE(in, "cannot read " + p.string());
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// One SQL statement as a source file holds it: its name (the C++ variable it is assigned to, empty in a
// migration) and its text (a C++ statement's string literals joined; a migration's text between two `;`).
struct statement {
    std::string file;
    std::string name;
    std::string sql;
};

// The string literals of each C++ statement (up to `;`), joined: adjacent literals are one SQL text.
std::vector<statement> cpp_statements(const std::string& file, const std::string& src) {
    std::vector<statement> out;
    std::string sql, code;
    std::string name;
    bool named = false;
    bool line_start = true;
    for (std::size_t i = 0; i < src.size(); ++i) {
        char c = src[i];
        if (c == '\n') {
            line_start = true;
            code += c;
            continue;
        }
        if (line_start && (c == ' ' || c == '\t')) continue;
        if (line_start && c == '#') {
            // A preprocessor line (and its continuations): a macro's literals are no statement of their own.
            while (i < src.size() && !(src[i] == '\n' && src[i - 1] != '\\')) ++i;
            line_start = true;
            continue;
        }
        line_start = false;
        if (c == '/' && i + 1 < src.size() && src[i + 1] == '/') {
            i = src.find('\n', i);
            if (i == std::string::npos) break;
            --i;  // the newline itself starts the next line
            continue;
        }
        if (c == '/' && i + 1 < src.size() && src[i + 1] == '*') {
            i = src.find("*/", i + 2);
            if (i == std::string::npos) break;
            ++i;
            continue;
        }
        if (c == '\'' && i > 0 && std::isalnum(static_cast<unsigned char>(src[i - 1]))) continue;  // 60'000
        if (c == '\'') {  // a character literal
            for (++i; i < src.size() && src[i] != '\''; ++i)
                if (src[i] == '\\') ++i;
            continue;
        }
        if (c == '"') {
            if (!named) {
                // The variable the first literal is assigned to: `name =` just before it.
                static const std::regex assigned(R"((\w+)\s*=\s*$)");
                std::smatch m;
                if (std::regex_search(code, m, assigned)) name = m[1];
                named = true;
            }
            for (++i; i < src.size() && src[i] != '"'; ++i) {
                if (src[i] == '\\') ++i;
                sql += src[i];
            }
            continue;
        }
        if (c == ';' || c == '{' || c == '}') {
            if (!sql.empty()) out.push_back({file, name, sql});
            sql.clear();
            code.clear();
            name.clear();
            named = false;
            continue;
        }
        code += c;
    }
    return out;
}

std::vector<statement> sql_statements(const std::string& file, const std::string& src) {
    std::vector<statement> out;
    std::size_t from = 0;
    while (from < src.size()) {
        auto to = src.find(';', from);
        if (to == std::string::npos) to = src.size();
        out.push_back({file, "", src.substr(from, to - from)});
        from = to + 1;
    }
    return out;
}

std::vector<statement> all_statements() {
    std::vector<statement> out;
    const auto root = source_root();
    for (const auto& e : fs::recursive_directory_iterator(root / "src" / "billing")) {
        auto ext = e.path().extension();
        if (ext != ".cpp" && ext != ".hpp") continue;
        if (e.path().filename() == "machine.cpp") continue;  // the table names statements, it runs none
        auto s = cpp_statements(e.path().filename().string(), slurp(e.path()));
        out.insert(out.end(), s.begin(), s.end());
    }
    for (const auto& e : fs::directory_iterator(root / "migrations")) {
        if (e.path().extension() != ".sql") continue;
        auto s = sql_statements(e.path().filename().string(), slurp(e.path()));
        out.insert(out.end(), s.begin(), s.end());
    }
    return out;
}

const std::map<std::string, machine::table> tables{{"billing_records", machine::table::charge},
                                                   {"billing_corrections", machine::table::revision},
                                                   {"billing_correction_moves", machine::table::move}};

// The states a text's status conditions name (`status = 'x'`, `status IN ('x', …)`, with or without a
// table alias).
std::set<std::string> status_conditions(const std::string& text) {
    std::set<std::string> out;
    static const std::regex eq(R"((?:^|[^\w.])(?:\w+\.)?status\s*=\s*'(\w+)')");
    static const std::regex in(R"((?:^|[^\w.])(?:\w+\.)?status\s+IN\s*\(([^)]*)\))", std::regex::icase);
    static const std::regex word(R"('(\w+)')");
    for (std::sregex_iterator it(text.begin(), text.end(), eq), end; it != end; ++it) out.insert((*it)[1]);
    for (std::sregex_iterator it(text.begin(), text.end(), in), end; it != end; ++it) {
        std::string list = (*it)[1];
        for (std::sregex_iterator w(list.begin(), list.end(), word); w != end; ++w) out.insert((*w)[1]);
    }
    return out;
}

// One UPDATE that sets a state: its table, the target (a literal state, or the expression that binds it)
// and the states it moves from (empty: its text names none).
struct state_write {
    statement where;
    machine::table on;
    std::string to;  // 'x' unquoted, or the expression
    bool literal = false;
    std::set<std::string> from;
};

std::vector<state_write> state_writes(const std::vector<statement>& statements) {
    std::vector<state_write> out;
    static const std::regex update(
        R"(UPDATE\s+(billing_records|billing_corrections|billing_correction_moves)\b)");
    static const std::regex set_status(R"((?:^|[\s,])status\s*=\s*('(\w+)'|[^,\s]+))");
    for (const auto& st : statements) {
        const std::string& sql = st.sql;
        for (std::sregex_iterator it(sql.begin(), sql.end(), update), end; it != end; ++it) {
            auto begin = static_cast<std::size_t>(it->position());
            // The UPDATE's own text: up to its RETURNING, or the parenthesis that closes its CTE.
            std::size_t stop = sql.size();
            int depth = 0;
            for (std::size_t p = begin; p < sql.size(); ++p) {
                if (sql[p] == '(') {
                    ++depth;
                } else if (sql[p] == ')') {
                    if (depth-- == 0) {
                        stop = p;
                        break;
                    }
                } else if (depth == 0 && sql.compare(p, 11, " RETURNING ") == 0) {
                    stop = p;
                    break;
                }
            }
            std::string text = sql.substr(begin, stop - begin);
            auto where_at = text.find(" WHERE ");
            std::string set_part = text.substr(0, where_at);
            std::string where_part = where_at == std::string::npos ? "" : text.substr(where_at);
            std::smatch m;
            if (!std::regex_search(set_part, m, set_status)) continue;  // moves no state
            state_write w{st, tables.at((*it)[1]), {}, false, {}};
            w.literal = m[2].matched;
            w.to = w.literal ? std::string(m[2]) : std::string(m[1]);
            // From: the UPDATE's WHERE; else the text before it (the CTE that locked the row, or the
            // migration's IF that guards it).
            w.from = status_conditions(where_part);
            if (w.from.empty()) w.from = status_conditions(sql.substr(0, begin));
            out.push_back(std::move(w));
        }
    }
    return out;
}

std::string key_of(const statement& s) {
    return s.file + ": " + s.name;
}

// The states a statement with a bound target can write, from the code that binds it.
const std::map<std::string, std::set<std::string>> bound_targets{
    // ledger.cpp's mark_charged, mark_declined, mark_cap_blocked, mark_conflict, mark_failed (one batch).
    {"ledger_sql.hpp: settle_sql", {"charged", "declined", "cap_blocked", "conflict", "failed"}},
    {"ledger_sql.hpp: settle_batch_sql", {"charged", "declined", "cap_blocked", "conflict", "failed"}},
    // corrections.cpp: a move's end, and the revision's end (machine::move_output).
    {"correction_ledger.cpp: ended_sql", {"declined", "failed"}},
    {"correction_ledger.cpp: finish_sql", {"applied", "declined", "failed"}},
};
// Written by apply_fact's result for any row the fact reaches: checked exhaustively below.
const std::string apply_fact_statement = "settlement_store.cpp: update_row_sql";

std::string command_statement(std::string_view command) {
    auto p = command.find(" (");
    return std::string(command.substr(0, p));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(machine_table)

BOOST_AUTO_TEST_CASE(every_state_is_a_state_of_its_table) {
    for (const auto& t : machine::transitions()) {
        auto st = machine::states(t.on);
        BOOST_TEST_CONTEXT(machine::to_string(t.on) << " " << t.from << " -> " << t.to) {
            BOOST_TEST((t.from.empty() || std::find(st.begin(), st.end(), t.from) != st.end()));
            BOOST_TEST((std::find(st.begin(), st.end(), t.to) != st.end()));
            BOOST_TEST(t.from != t.to);
        }
    }
    // A charge's states are the ledger's record_status values, each reachable.
    for (auto s : machine::states(machine::table::charge)) {
        BOOST_TEST_CONTEXT(s) {
            BOOST_TEST(parse_record_status(s).has_value());
            bool reached =
                std::any_of(machine::transitions().begin(), machine::transitions().end(),
                            [&](const auto& t) { return t.on == machine::table::charge && t.to == s; });
            BOOST_TEST(reached);
        }
    }
}

// Every UPDATE in src/billing and the migrations that sets a state moves only along the table; a new
// statement with an undocumented transition fails here.
BOOST_AUTO_TEST_CASE(every_statement_that_moves_a_state_is_in_the_table) {
    const auto statements = all_statements();
    const auto writes = state_writes(statements);
    BOOST_TEST_REQUIRE(writes.size() >= 12u);  // the scan finds the statements at all
    std::set<std::string> seen;
    for (const auto& w : writes) {
        const auto key = key_of(w.where);
        seen.insert(key);
        BOOST_TEST_CONTEXT(key << " sets " << machine::to_string(w.on) << " status = " << w.to) {
            std::set<std::string> targets;
            if (w.literal) {
                targets = {w.to};
            } else if (bound_targets.count(key)) {
                targets = bound_targets.at(key);
            } else {
                BOOST_TEST(key == apply_fact_statement, "a state bound by code no test enumerates");
                continue;
            }
            if (w.from.empty()) {
                // A migration's plpgsql guards it by its IF; the target must at least be reachable.
                BOOST_TEST(w.where.name.empty(), "a statement that names no from-state");
                for (const auto& to : targets) {
                    bool reached = std::any_of(machine::transitions().begin(), machine::transitions().end(),
                                               [&](const auto& t) { return t.on == w.on && t.to == to; });
                    BOOST_TEST(reached, "no transition reaches " << to);
                }
                continue;
            }
            for (const auto& from : w.from)
                for (const auto& to : targets)
                    if (from != to) BOOST_TEST(machine::allowed(w.on, from, to), from << " -> " << to);
        }
    }
    // Each bound statement was found (the scan still sees it), and each row of the table names a statement
    // that exists.
    for (const auto& [key, _] : bound_targets) BOOST_TEST(seen.count(key) == 1u, key);
    BOOST_TEST(seen.count(apply_fact_statement) == 1u);
    std::set<std::string> names;
    for (const auto& s : statements) names.insert(key_of(s));
    for (const auto& t : machine::transitions()) {
        auto cmd = command_statement(t.command);
        if (cmd.ends_with(": cg_correction_admit")) {
            auto sql = slurp(source_root() / "migrations" / cmd.substr(0, cmd.find(':')));
            BOOST_TEST(sql.find("FUNCTION cg_correction_admit") != std::string::npos, cmd);
            continue;
        }
        BOOST_TEST(names.count(cmd) == 1u, "the table names a statement that does not exist: " << cmd);
    }
}

// What a webhook or the poll can do to a row (apply_fact) moves it only along the table: every state × every
// fact kind × a fact about the row's own payment.
BOOST_AUTO_TEST_CASE(apply_fact_moves_only_along_the_table) {
    const fact_kind kinds[] = {fact_kind::processing,     fact_kind::succeeded,     fact_kind::failed,
                               fact_kind::refunded,       fact_kind::refund_update, fact_kind::dispute_opened,
                               fact_kind::dispute_closed, fact_kind::no_news,       fact_kind::unknown_type};
    for (auto s : machine::states(machine::table::charge)) {
        for (auto k : kinds) {
            for (bool with_charge : {true, false}) {
                settlement_row row;
                row.status = *parse_record_status(s);
                row.amount_cents = 1000;
                row.payment_intent_id = "pi_1";
                if (with_charge) row.charge_id = "ch_1";
                payment_fact f;
                f.kind = k;
                f.payment_intent_id = "pi_1";
                f.charge_id = "ch_1";
                f.amount_refunded = 100;
                f.dispute_amount = 100;
                auto c = apply_fact(row, f);
                if (c.row.status == row.status) continue;
                BOOST_TEST(machine::allowed(row.status, c.row.status),
                           s << " -> " << to_string(c.row.status) << " by " << to_string(k));
            }
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

// docs/design.md holds `generated` between the markers of `block`, or (CHARGEGUARD_WRITE_DESIGN_TABLE=1) is
// rewritten to.
void design_md_holds(const std::string& block, const std::string& generated) {
    const auto path = source_root() / "docs" / "design.md";
    std::string doc = slurp(path);
    const std::string begin =
        "<!-- begin: " + block + " (generated: tests/unit/billing/machine_test.cpp) -->\n";
    const std::string end = "<!-- end: " + block + " -->";
    auto b = doc.find(begin);
    auto e = doc.find(end);
    BOOST_TEST_REQUIRE(b != std::string::npos, "docs/design.md lacks the begin marker: " << begin);
    BOOST_TEST_REQUIRE(e != std::string::npos, "docs/design.md lacks the end marker: " << end);
    BOOST_TEST_REQUIRE(b < e);
    const std::string held = doc.substr(b + begin.size(), e - b - begin.size());
    const char* write = std::getenv("CHARGEGUARD_WRITE_DESIGN_TABLE");
    if (write && std::string(write) == "1" && held != generated) {
        doc.replace(b + begin.size(), e - b - begin.size(), generated);
        std::ofstream(path, std::ios::binary | std::ios::trunc) << doc;
        return;
    }
    BOOST_TEST(held == generated, "docs/design.md's " << block
                                                      << " differ from the code; rewrite them with "
                                                         "CHARGEGUARD_WRITE_DESIGN_TABLE=1 test_billing "
                                                         "--run_test=design_md_holds_the_machine_table");
}

}  // namespace

// docs/design.md holds the tables between their markers, exactly as the code prints them.
BOOST_AUTO_TEST_CASE(design_md_holds_the_machine_table) {
    design_md_holds("money machine transitions", machine::markdown());
    design_md_holds("money machine answers", machine::answers_markdown());
}
