// `chargeguard consume --validate`: every dependency reached once with the configuration given.
#pragma once

#include "app/pg_flags.hpp"
#include "core/log.hpp"
#include "nsq/consumer.hpp"
#include "stripe/client.hpp"

namespace cg::app {

// A PostgreSQL connection, each nsqd (TCP) or nsqlookupd (/ping), and Stripe with the key (GET
// /v1/charges?limit=1: read-only, answered 401 for a bad key), one line each on stdout. Exit 0 when all
// answered, 78 otherwise: this configuration does not work from here.
int validate_consume(const pg_flags& pg, const nsq::consumer_config& ncfg, stripe::client_config scfg,
                     const logger& log);

}  // namespace cg::app
