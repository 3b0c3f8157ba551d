#include "nsq/channel_depth.hpp"

#include "http/proto/message.hpp"
#include "net/address.hpp"
#include "net/timeout.hpp"
#include "nsq/http_get.hpp"
#include "nsq/proto/lookup.hpp"
#include "nsq/proto/stats.hpp"
#include "nsq/task.hpp"

namespace cg::nsq {
namespace {

// "http://host:port/…" or "host:port" → host:port.
std::string bare_address(const std::string& addr) {
    std::string a = addr.rfind("http://", 0) == 0 ? addr.substr(7) : addr;
    if (auto slash = a.find('/'); slash != std::string::npos) a.resize(slash);
    return a;
}

// A producer's HTTP address as lookupd lists it (IPv6 in brackets).
std::string http_address(const proto::producer_info& p) {
    if (p.broadcast_address.find(':') != std::string::npos)
        return "[" + p.broadcast_address + "]:" + std::to_string(p.http_port);
    return p.broadcast_address + ":" + std::to_string(p.http_port);
}

}  // namespace

channel_depth_monitor::channel_depth_monitor(asio::any_io_executor ex, channel_depth_config cfg,
                                             metrics::registry& reg, logger log)
    : ex_(ex),
      cfg_(std::move(cfg)),
      depth_(reg.gauge("chargeguard_nsq_channel_depth",
                       "Messages queued for the consume's channel at each nsqd (nsqd's /stats depth: memory "
                       "and disk, not in flight), read every --channel-depth-interval")),
      log_(std::move(log)) {}

void channel_depth_monitor::start() {
    net::job_spec job;
    job.name = "channel depth monitor";
    job.interval = cfg_.interval;
    job.first_after = std::chrono::milliseconds(0);
    auto self = shared_from_this();
    task_.start_job(
        ex_, self, std::move(job), [this] { return pass(); }, log_);
}

void channel_depth_monitor::stop() {
    task_.request_stop();
}

asio::awaitable<bool> channel_depth_monitor::pass() {
    co_await round();
    co_return true;
}

// The nsqds to ask this round: those given directly, and those some nsqlookupd lists for the topic. When no
// lookupd answers, the ones read last round stay (lookupd being down is not nsqd being down).
asio::awaitable<std::set<std::string>> channel_depth_monitor::nsqds() {
    std::set<std::string> out(cfg_.nsqd_http_addresses.begin(), cfg_.nsqd_http_addresses.end());
    bool any_answer = cfg_.lookupd_http_addresses.empty();
    for (const auto& addr : cfg_.lookupd_http_addresses) {
        auto hp = net::parse_host_port(bare_address(addr));
        if (!hp) continue;
        auto r = co_await http_get(*hp, "/lookup?topic=" + http::url_encode(cfg_.topic),
                                   "application/vnd.nsq; version=1.0", cfg_.timeout);
        if (task_.stopping()) co_return out;
        if (!r || (r->status != 200 && r->status != 404)) continue;  // the lookupd poller logs these
        any_answer = true;
        if (r->status == 404) continue;
        auto producers = proto::parse_lookup_response(r->body);
        if (!producers) continue;
        for (const auto& p : *producers)
            if (p.http_port != 0) out.insert(http_address(p));
    }
    if (!any_answer)
        for (const auto& [nsqd, gauge] : series_) out.insert(nsqd);
    co_return out;
}

asio::awaitable<void> channel_depth_monitor::round() {
    auto nsqds_now = co_await nsqds();
    if (task_.stopping()) co_return;
    // Series of nsqds no longer listed go.
    for (auto it = series_.begin(); it != series_.end();) {
        if (nsqds_now.contains(it->first)) {
            ++it;
            continue;
        }
        depth_.Remove(it->second);
        it = series_.erase(it);
    }
    const std::string target = "/stats?format=json&topic=" + http::url_encode(cfg_.topic) +
                               "&channel=" + http::url_encode(cfg_.channel);
    for (const auto& nsqd : nsqds_now) {
        std::string why;
        std::optional<std::int64_t> depth;
        auto hp = net::parse_host_port(nsqd);
        if (!hp) {
            why = "not host:port";
        } else {
            auto r = co_await http_get(*hp, target, "application/json", cfg_.timeout);
            if (task_.stopping()) co_return;
            if (!r) {
                why = r.err().describe();
            } else if (r->status != 200) {
                why = "status " + std::to_string(r->status);
            } else {
                auto d = proto::parse_channel_depth(r->body, cfg_.topic, cfg_.channel);
                if (!d)
                    why = d.err().describe();
                else if (!*d)
                    why = "the channel does not exist there (yet)";
                else
                    depth = **d;
            }
        }
        auto it = series_.find(nsqd);
        if (!depth) {
            if (it != series_.end()) {
                depth_.Remove(it->second);
                series_.erase(it);
            }
            if (failing_.insert(nsqd).second)
                log_.warn(
                    "nsqd channel depth not read",
                    {{"nsqd", nsqd}, {"topic", cfg_.topic}, {"channel", cfg_.channel}, {"reason", why}});
            continue;
        }
        if (failing_.erase(nsqd) > 0) log_.info("nsqd channel depth read again", {{"nsqd", nsqd}});
        if (it == series_.end())
            it = series_
                     .emplace(nsqd,
                              &depth_.Add({{"topic", cfg_.topic}, {"channel", cfg_.channel}, {"nsqd", nsqd}}))
                     .first;
        it->second->Set(static_cast<double>(*depth));
    }
    ++rounds_;
}

}  // namespace cg::nsq
