// The NSQ side of the billing pipeline, as `consume` runs it and the lab's safe consumer runs it too: a
// message becomes a billing::delivery, the message is TOUCHed for the whole run (the keepalive every
// msg_timeout / 2, and once more for every lease renewal while Stripe is awaited), and the verdict becomes
// the message's disposition. Runs on the consumer's executor.
#pragma once

#include <string>

#include "billing/flow/charge_flow.hpp"
#include "billing/machine/outcome.hpp"
#include "net/tokens.hpp"
#include "nsq/message.hpp"

namespace cg::billing {

// Takes the message's body (nsq::message::take_body): the delivery holds the only copy while it runs.
delivery delivery_of(nsq::message& m, const std::string& topic, const std::string& channel);

// Every billing verdict carries its own delay (the lease's remaining time, a Stripe retry delay, a
// PostgreSQL backoff by attempt), so none of them uses go-nsq's handler backoff: that pauses every
// connection (RDY 0) and climbs one level per failed message, so one PostgreSQL restart with many messages
// in flight would park the whole consumer for minutes after the database is back. Handler backoff stays for
// what it is for: a handler that throws (a bug). A requeue is "not now", never a handler failure.
nsq::disposition to_disposition(const verdict& v);

// The pipeline's verdict on `m` — past max attempts (`give_up`) the same machine, which dead-letters only
// what can never succeed, so a valid event is never dropped for being redelivered often — with `m`
// TOUCHed throughout. The caller keeps `m` and `p` alive until it completes.
net::awaitable<verdict> run_delivery(charge_flow& p, nsq::message& m, const std::string& topic,
                                     const std::string& channel, bool give_up);

// run_delivery's verdict as the message's disposition (to_disposition), in the same coroutine: what a
// consumer's handler returns.
net::awaitable<nsq::disposition> run_delivery_disposition(charge_flow& p, nsq::message& m,
                                                          const std::string& topic,
                                                          const std::string& channel, bool give_up);

}  // namespace cg::billing
