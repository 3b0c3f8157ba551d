#include "app/pipeline_flags.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "app/cli.hpp"
#include "billing/machine/key.hpp"

namespace cg::app {

using std::chrono::milliseconds;

void add_pipeline_flags(CLI::App& cmd, pipeline_flags& f) {
    auto before = cmd.get_options().size();
    env(cmd.add_option("--key-namespace", f.key_namespace,
                       "prefix hashed into every idempotency key (1-64 of [A-Za-z0-9_.-]); never change it "
                       "for a live ledger: a new namespace means new keys")
            ->capture_default_str(),
        env_scope::connection);
    cmd.add_option("--lease", f.lease, "how long a pending ledger row stays this worker's without renewal")
        ->capture_default_str();
    cmd.add_option("--lease-renew-interval", f.lease_renew_interval,
                   "how often the lease is renewed while Stripe is awaited (shorter than --lease)")
        ->capture_default_str();
    cmd.add_option("--lease-held-delay", f.lease_held_delay,
                   "REQ delay when another worker holds the row's lease (no handler backoff)")
        ->capture_default_str();
    cmd.add_option("--retry-same-key-delay", f.retry_same_key_delay,
                   "REQ delay when Stripe said nothing happened (409 in use, 429, not sent)")
        ->capture_default_str();
    cmd.add_option("--indeterminate-delay", f.indeterminate_delay,
                   "REQ delay after a 5xx or a timeout, before recovery searches Stripe")
        ->capture_default_str();
    cmd.add_option("--correction-wait-delay", f.correction_wait_delay,
                   "requeue delay of a correction whose previous revision (or original charge) has not ended")
        ->capture_default_str();
    cmd.add_option("--search-failed-delay", f.search_failed_delay,
                   "REQ delay when the recovery search of the customer's charges failed")
        ->capture_default_str();
    cmd.add_option("--new-key-quiet", f.new_key_quiet,
                   "a new key generation waits until no call under the old one has shown life (its "
                   "attempt, a lease renewal) for this long; at least 2 x --lease-renew-interval")
        ->capture_default_str();
    cmd.add_option("--group-commit-linger-max", f.group_commit_linger_max,
                   "longest a ledger group-commit statement waits for more rows (it waits 1% of the recent "
                   "Stripe call time, up to this; 0 = never waits)")
        ->capture_default_str();
    auto opts = cmd.get_options();
    for (auto i = before; i < opts.size(); ++i) opts[i]->group(group_pipeline);
}

namespace {

milliseconds duration_in_range(const char* flag, const std::string& v, milliseconds min, milliseconds max) {
    auto d = duration_flag(flag, v);
    if (d < min || d > max)
        bad_value(flag, v,
                  "out of range " + format_duration(static_cast<double>(min.count()) / 1000) + " .. " +
                      format_duration(static_cast<double>(max.count()) / 1000));
    return d;
}

}  // namespace

billing::charge_flow_config to_pipeline_config(const pipeline_flags& f) {
    using namespace std::chrono_literals;
    billing::charge_flow_config c;
    if (!billing::valid_key_namespace(f.key_namespace))
        bad_value("--key-namespace", f.key_namespace, "not 1-64 characters of [A-Za-z0-9_.-]");
    c.key_namespace = f.key_namespace;
    c.lease = duration_in_range("--lease", f.lease, 1s, 24h);
    c.lease_renew_interval = duration_in_range("--lease-renew-interval", f.lease_renew_interval, 10ms, 24h);
    if (c.lease_renew_interval >= c.lease)
        throw CLI::ValidationError("--lease-renew-interval",
                                   f.lease_renew_interval + " must be shorter than --lease " + f.lease +
                                       " (a lease renewed no sooner than it expires can be taken over while "
                                       "Stripe is still answering)");
    // nsqd refuses a REQ timeout above its --max-req-timeout (1 h by default).
    c.lease_held_delay = duration_in_range("--lease-held-delay", f.lease_held_delay, 0ms, 1h);
    c.retry_same_key_delay = duration_in_range("--retry-same-key-delay", f.retry_same_key_delay, 0ms, 1h);
    c.indeterminate_delay = duration_in_range("--indeterminate-delay", f.indeterminate_delay, 0ms, 1h);
    c.correction_wait_delay = duration_in_range("--correction-wait-delay", f.correction_wait_delay, 0ms, 1h);
    c.stripe_unavailable_delay = duration_in_range("--search-failed-delay", f.search_failed_delay, 0ms, 1h);
    // A call in flight shows life every renewal interval: a quiet period shorter than two of them could
    // mistake a live call for a dead one.
    c.new_key_quiet = duration_in_range("--new-key-quiet", f.new_key_quiet, 2 * c.lease_renew_interval, 1h);
    c.group_commit_linger_max =
        duration_in_range("--group-commit-linger-max", f.group_commit_linger_max, 0ms, 100ms);
    if (const char* pause = std::getenv("CHARGEGUARD_TEST_STEP_PAUSE_MS"))
        c.test_step_pause = milliseconds(std::clamp(std::atoll(pause), 0LL, 1000LL));
    return c;
}

}  // namespace cg::app
