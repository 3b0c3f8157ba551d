// pg::connection: the per-connection cache of prepared statements (named by SQL text and parameter types).
#include "pg/connection_impl.hpp"

namespace cg::pg {

using detail::deadline_after;
using detail::trim;

connection::stmt_plan connection::plan_statement(const std::string& sql, const params& p) {
    if (opts_.max_prepared == 0) return {};
    // Keyed by text and parameter types: a statement prepared for int4 must not receive an int8.
    std::string key = sql;
    key.push_back('\0');
    key.append(reinterpret_cast<const char*>(p.types()),
               static_cast<std::size_t>(p.size()) * sizeof(unsigned));
    if (auto it = prepared_.find(key); it != prepared_.end()) return {it->second, {}, false};
    if (prepared_.size() >= opts_.max_prepared) return {};
    return {"cg_" + std::to_string(next_statement_++), std::move(key), true};
}

bool connection::send_statement(const std::string& sql, const params& p, const stmt_plan& plan) {
    if (plan.name.empty())
        return PQsendQueryParams(conn_, sql.c_str(), p.size(), p.types(), p.values(), p.lengths(),
                                 p.formats(), 0);
    return PQsendQueryPrepared(conn_, plan.name.c_str(), p.size(), p.values(), p.lengths(), p.formats(), 0);
}

}  // namespace cg::pg
