// `chargeguard vault issue | list | show | revoke | set-policy | forfeit-lease`: vault keys for the spend-cap
// proxy (docs/design.md §1, §5). `issue` prints the secret once on stdout (and nothing else there, so
// `secret=$(chargeguard vault issue …)` works); the description goes to stderr. Only the secret's SHA-256 is
// stored. `list` and `show` print through app/vault_listing.*.
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/pg_flags.hpp"
#include "app/vault_expected.hpp"
#include "app/vault_forfeit.hpp"
#include "app/vault_listing.hpp"
#include "billing/machine/event.hpp"
#include "net/offload.hpp"
#include "pg/error.hpp"
#include "pg/types.hpp"
#include "vault/cap.hpp"
#include "vault/policy.hpp"
#include "vault/secret.hpp"
#include "vault/store.hpp"

namespace cg::app {
namespace {

using vault_listing::fail;

struct issue_flags {
    pg_flags pg;
    std::string name, period, currency, expected_file, headroom = "1.10",
                                                       allow = std::string(vault::default_allow), expires_at;
    std::string stripe_account;  // the one Stripe Connect account the key may act in
    std::optional<std::int64_t> expected_cents;
    bool refunds_reopen_cap = false;
};
struct vault_list_flags {
    pg_flags pg;
    bool json = false;
};
struct vault_show_flags {
    pg_flags pg;
    std::string id;
    int audit = 20;
    bool json = false;
};
struct vault_revoke_flags {
    pg_flags pg;
    std::string id;
};

using vault_forfeit_flags = vault_forfeit::flags;

struct vault_policy_flags {
    pg_flags pg;
    std::string id;
    bool refunds_reopen_cap = false;
};

// Runs `body(store)` against a one-connection pool on a private loop; returns its exit code.
template <typename Body>
int with_store(const pg_flags& f, const global_flags& g, Body body) {
    auto log = make_stderr_logger(g.level());
    pg::pool_options o = to_pool_options(f);
    o.size = 1;
    asio::io_context io{1};
    net::offload_pool offload{1};
    auto pool = pg::pool::create(io.get_executor(), offload.get_executor(), std::move(o), log);
    int rc = 1;
    std::exception_ptr failure;
    asio::co_spawn(
        io,
        [](std::shared_ptr<pg::pool> p, Body b) -> net::awaitable<int> {
            vault::store s(p);
            int r = co_await b(s);
            co_await p->close();
            co_return r;
        }(pool, std::move(body)),
        [&](std::exception_ptr e, int r) {
            failure = e;
            rc = r;
        });
    io.run();
    offload.drain();
    if (failure) std::rethrow_exception(failure);
    return rc;
}

std::string money(std::int64_t cents, const std::string& currency) {
    std::string s = std::to_string(cents / 100) + ".";
    std::int64_t frac = cents % 100;
    s += (frac < 10 ? "0" : "") + std::to_string(frac);
    return s + " " + currency;
}

// RFC 3339 with an explicit offset ("2026-12-31T23:59:59Z", "…+01:00"): the shape only; PostgreSQL parses it.
bool rfc3339(const std::string& s) {
    if (s.size() < 20 || s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') ||
        s[13] != ':')
        return false;
    return s.back() == 'Z' || s.back() == 'z' ||
           (s.size() >= 6 && (s[s.size() - 6] == '+' || s[s.size() - 6] == '-'));
}

// The expected total: --expected-total-cents, or the sum over --expected-file with a report on stderr.
std::int64_t expected_of(const issue_flags& f) {
    if (f.expected_cents) {
        if (*f.expected_cents < 0)
            throw CLI::ValidationError("--expected-total-cents", "must not be negative");
        return *f.expected_cents;
    }
    std::ifstream in(f.expected_file);
    if (!in) throw CLI::ValidationError("--expected-file", "cannot read '" + f.expected_file + "'");
    // The key acts in one account (the platform's own without --stripe-account): only its events count.
    auto t = sum_expected(in, f.period, f.currency, f.stripe_account);
    std::fprintf(stderr, "%s: %zu lines, %zu events of period %s in %s summed to %s; %zu skipped\n",
                 f.expected_file.c_str(), t.lines, t.counted, f.period.c_str(),
                 f.stripe_account.empty() ? "the platform's own account" : f.stripe_account.c_str(),
                 money(t.total_cents, f.currency).c_str(), t.skipped_total());
    for (const auto& [why, n] : t.skipped) std::fprintf(stderr, "  skipped %zu × %s\n", n, why.c_str());
    if (t.counted == 0) throw CLI::ValidationError("--expected-file", "no valid event of period " + f.period);
    return t.total_cents;
}

net::awaitable<int> issue(vault::store& s, const issue_flags& f, vault::new_key k, std::int64_t expected) {
    for (int attempt = 0;; ++attempt) {
        auto sec = vault::issue_secret();
        if (!sec) co_return fail("issue", sec.err());
        k.id = sec->id;
        k.secret_hash = sec->hash;
        auto r = co_await s.insert_key(k);
        if (!r && r.code() == pg::errc::unique_violation && attempt < 3)
            continue;  // an id (or hash) collision
        if (!r) co_return fail("issue", r.err());
        // Before the secret is shown: a key whose policy was not written is never handed out.
        if (f.refunds_reopen_cap) {
            auto p = co_await s.set_refunds_reopen_cap(k.id, true);
            if (!p) co_return fail("issue", p.err());
        }
        std::fprintf(
            stderr,
            "issued vault key %s \"%s\": period %s, cap %s (expected %s × %s), allows %s, expires %s\n",
            k.id.c_str(), k.name.c_str(), k.billing_period.c_str(), money(k.cap_cents, k.currency).c_str(),
            money(expected, k.currency).c_str(), f.headroom.c_str(), f.allow.c_str(),
            k.expires_at ? k.expires_at->c_str() : "never");
        std::fprintf(stderr, "acts in %s\n",
                     k.stripe_account.empty()
                         ? "the platform's own account (any Stripe-Account refused)"
                         : ("connected account " + k.stripe_account +
                            " only (requests must send Stripe-Account: " + k.stripe_account + ")")
                               .c_str());
        std::fprintf(stderr, "refunds %s\n",
                     f.refunds_reopen_cap ? "give the cap its room back (--refunds-reopen-cap)"
                                          : "are recorded and do not reopen cap room");
        std::fprintf(stderr, "the secret below is shown once; only its hash is stored\n");
        std::printf("%s\n", sec->secret.c_str());
        co_return 0;
    }
}

int run_issue(const issue_flags& f, const global_flags& g) {
    if (f.currency.size() != 3 ||
        !std::all_of(f.currency.begin(), f.currency.end(), [](char c) { return c >= 'a' && c <= 'z'; }))
        throw CLI::ValidationError("--currency", "three lower-case letters (ISO 4217), e.g. usd");
    auto h = vault::parse_headroom(f.headroom);
    if (!h) throw CLI::ValidationError("--headroom", h.err().message);
    auto allowed = vault::parse_allow_list(f.allow);
    if (!allowed) throw CLI::ValidationError("--allow", allowed.err().message);
    if (!f.expires_at.empty() && !rfc3339(f.expires_at))
        throw CLI::ValidationError("--expires-at",
                                   "'" + f.expires_at + "' is not RFC 3339 (2026-12-31T23:59:59Z)");
    std::int64_t expected = expected_of(f);
    auto cap = vault::cap_for(expected, *h);
    if (!cap) throw CLI::ValidationError("--headroom", cap.err().message);
    vault::new_key k;
    k.name = f.name;
    k.billing_period = f.period;
    k.currency = f.currency;
    k.cap_cents = *cap;
    k.allowed = *allowed;
    if (!f.expires_at.empty()) k.expires_at = f.expires_at;
    if (!f.stripe_account.empty() && !billing::valid_stripe_account(f.stripe_account))
        throw CLI::ValidationError("--stripe-account",
                                   "'" + f.stripe_account + "' is not acct_ followed by letters and digits");
    k.stripe_account = f.stripe_account;
    return with_store(f.pg, g, [&f, k, expected](vault::store& s) { return issue(s, f, k, expected); });
}

net::awaitable<int> revoke(vault::store& s, std::string id) {
    auto r = co_await s.revoke(id);
    if (!r) co_return fail("revoke", r.err());
    if (!*r) {
        std::fprintf(stderr,
                     "chargeguard vault revoke: no usable vault key %s (unknown or already revoked)\n",
                     id.c_str());
        co_return 1;
    }
    std::fprintf(stderr, "revoked vault key %s: the proxy refuses it from now on (401)\n", id.c_str());
    co_return 0;
}

net::awaitable<int> set_policy(vault::store& s, std::string id, bool reopen) {
    auto r = co_await s.set_refunds_reopen_cap(id, reopen);
    if (!r) co_return fail("set-policy", r.err());
    if (!*r) {
        std::fprintf(stderr, "chargeguard vault set-policy: no vault key %s\n", id.c_str());
        co_return 1;
    }
    std::fprintf(stderr, "vault key %s: refunds %s from the next refund event on\n", id.c_str(),
                 reopen ? "give the cap its room back" : "do not reopen cap room");
    co_return 0;
}

}  // namespace

void register_vault(CLI::App& app, command_main& selected) {
    auto* vault_cmd = app.add_subcommand("vault", "manage spend-cap vault keys for `chargeguard proxy`");
    vault_cmd->require_subcommand(1);
    vault_cmd->footer(
        "Examples:\n"
        "  chargeguard vault issue --name run-2026-11 --period 2026-11 --currency usd --expected-file "
        "run.jsonl\n"
        "  chargeguard vault list\n"
        "  chargeguard vault revoke vk_…\n"
        "  chargeguard vault set-policy vk_… --refunds-reopen-cap=true\n"
        "  chargeguard vault forfeit-lease vk_… --lease 42 --keep-cents 0\n"
        "Key names, periods and ids come from the command line only, never from CHARGEGUARD_* variables.\n");

    auto fi = std::make_shared<issue_flags>();
    auto* issue_cmd =
        vault_cmd->add_subcommand("issue", "issue a vault key; prints its secret once on stdout");
    add_pg_flags(*issue_cmd, fi->pg, false);
    issue_cmd->add_option("--name", fi->name, "what the key is for (shown by list)")->required();
    issue_cmd->add_option("--period", fi->period, "the billing period it may spend for, e.g. 2026-11")
        ->required();
    issue_cmd->add_option("--currency", fi->currency, "ISO 4217 code, lower case (usd)")->required();
    auto* total =
        issue_cmd->add_option("--expected-total-cents", fi->expected_cents, "the period's expected spend");
    auto* file = issue_cmd->add_option(
        "--expected-file", fi->expected_file,
        "JSONL billing run (as `publish` takes): sums amount_cents of the period's valid "
        "events, each customer once");
    total->excludes(file);
    file->excludes(total);
    issue_cmd->add_option("--headroom", fi->headroom, "cap = floor(expected × headroom), exact decimal")
        ->capture_default_str();
    issue_cmd->add_option("--allow", fi->allow, "comma-separated operations the key may call")
        ->capture_default_str();
    issue_cmd->add_option("--expires-at", fi->expires_at, "RFC 3339 expiry (default: none)");
    issue_cmd->add_option(
        "--stripe-account", fi->stripe_account,
        "scope the key to this Stripe Connect account (acct_…): the proxy forwards requests "
        "sending exactly this Stripe-Account and refuses any other or none (default: the "
        "platform's own account; any Stripe-Account refused)");
    issue_cmd->add_flag("--refunds-reopen-cap", fi->refunds_reopen_cap,
                        "a refund gives the cap its room back (default: refunds are recorded only)");
    issue_cmd->callback([&selected, fi, total, file] {
        if (total->count() + file->count() != 1)
            throw CLI::ValidationError("vault issue",
                                       "give exactly one of --expected-total-cents or --expected-file");
        selected = [fi](const global_flags& g) { return run_issue(*fi, g); };
    });

    auto fl = std::make_shared<vault_list_flags>();
    auto* list_cmd = vault_cmd->add_subcommand("list", "list vault keys with cap, spend and utilisation");
    add_pg_flags(*list_cmd, fl->pg, false);
    list_cmd->add_flag("--json", fl->json, "one JSON array");
    list_cmd->callback([&selected, fl] {
        selected = [fl](const global_flags& g) {
            return with_store(fl->pg, g,
                              [json = fl->json](vault::store& s) { return vault_listing::list(s, json); });
        };
    });

    auto fs = std::make_shared<vault_show_flags>();
    auto* show_cmd = vault_cmd->add_subcommand("show", "one vault key and its last audit rows");
    add_pg_flags(*show_cmd, fs->pg, false);
    show_cmd->add_option("id", fs->id, "vault key id")->required();
    show_cmd->add_option("--audit", fs->audit, "audit rows to show")
        ->check(CLI::Range(0, 10000))
        ->capture_default_str();
    show_cmd->add_flag("--json", fs->json, "one JSON object");
    show_cmd->callback([&selected, fs] {
        selected = [fs](const global_flags& g) {
            return with_store(fs->pg, g, [fs](vault::store& s) {
                return vault_listing::show(s, fs->id, fs->audit, fs->json);
            });
        };
    });

    auto fr = std::make_shared<vault_revoke_flags>();
    auto* revoke_cmd =
        vault_cmd->add_subcommand("revoke", "revoke a vault key (the proxy answers 401 from then on)");
    add_pg_flags(*revoke_cmd, fr->pg, false);
    revoke_cmd->add_option("id", fr->id, "vault key id")->required();
    revoke_cmd->callback([&selected, fr] {
        selected = [fr](const global_flags& g) {
            return with_store(fr->pg, g, [id = fr->id](vault::store& s) { return revoke(s, id); });
        };
    });

    auto ff = std::make_shared<vault_forfeit_flags>();
    auto* forfeit_cmd = vault_cmd->add_subcommand(
        "forfeit-lease",
        "give back a cap lease a dead proxy left open (cg_vault_lease_forfeit); only an expired one "
        "unless --force");
    add_pg_flags(*forfeit_cmd, ff->pg, false);
    forfeit_cmd->add_option("id", ff->id, "vault key id")->required();
    forfeit_cmd->add_option("--lease", ff->lease, "the lease's id (vault show lists them)");
    forfeit_cmd->add_option("--holder", ff->holder,
                            "the lease's holder (host:pid:random, as vault show prints)");
    forfeit_cmd
        ->add_option("--keep-cents", ff->keep_cents,
                     "cents of the lease that stay counted: the holder's creates found on Stripe without a "
                     "vault_spend row (docs/operating/vault.md)")
        ->required()
        ->check(CLI::Range(std::int64_t{0}, std::numeric_limits<std::int64_t>::max()));
    forfeit_cmd->add_flag("--force", ff->force,
                          "forfeit a lease that has not expired (its holder may be alive)");
    forfeit_cmd->callback([&selected, ff] {
        selected = [ff](const global_flags& g) {
            return with_store(ff->pg, g,
                              [f = *ff](vault::store& s) { return vault_forfeit::forfeit_lease(s, f); });
        };
    });

    auto fp = std::make_shared<vault_policy_flags>();
    auto* policy_cmd = vault_cmd->add_subcommand(
        "set-policy", "set a vault key's refund policy (does a refund give the cap its room back?)");
    add_pg_flags(*policy_cmd, fp->pg, false);
    policy_cmd->add_option("id", fp->id, "vault key id")->required();
    policy_cmd
        ->add_option("--refunds-reopen-cap", fp->refunds_reopen_cap,
                     "true: a refund reopens cap room; false: refunds are recorded only")
        ->required();
    policy_cmd->callback([&selected, fp] {
        selected = [fp](const global_flags& g) {
            return with_store(fp->pg, g, [id = fp->id, reopen = fp->refunds_reopen_cap](vault::store& s) {
                return set_policy(s, id, reopen);
            });
        };
    });
}

}  // namespace cg::app
