// vault_proxy bench: the chargeguard child processes and what /proc and pg_stat_activity tell of the CPU
// time of every party.
#include <fcntl.h>
#include <libpq-fe.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include "tests/bench/proxy/vault_proxy.hpp"

extern char** environ;

namespace vault_bench {

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

double cpu_seconds(const std::string& stat_path) {
    std::ifstream in(stat_path);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto rp = s.rfind(')');
    if (rp == std::string::npos) return 0;
    std::istringstream rest(s.substr(rp + 2));
    std::string field;
    long ut = 0, st = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
        if (i == 14) ut = std::atol(field.c_str());
        if (i == 15) st = std::atol(field.c_str());
    }
    return static_cast<double>(ut + st) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}
double pid_cpu(long pid) {
    return cpu_seconds("/proc/" + std::to_string(pid) + "/stat");
}

std::vector<long> backends_of(const std::string& db) {
    std::vector<long> out;
    PGconn* c = PQconnectdb("");
    if (PQstatus(c) == CONNECTION_OK) {
        std::string sql =
            "SELECT pid FROM pg_stat_activity WHERE datname = '" + db + "' AND pid <> pg_backend_pid()";
        PGresult* r = PQexec(c, sql.c_str());
        if (PQresultStatus(r) == PGRES_TUPLES_OK)
            for (int i = 0; i < PQntuples(r); ++i) out.push_back(std::atol(PQgetvalue(r, i, 0)));
        PQclear(r);
    }
    PQfinish(c);
    return out;
}

child::child(const std::vector<std::string>& args, const std::string& tag) {
    out = "/tmp/cg-bench-" + tag + "-" + std::to_string(::getpid()) + ".out";
    err = out.substr(0, out.size() - 4) + ".err";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0)
        throw std::runtime_error("spawn " + args[0]);
    posix_spawn_file_actions_destroy(&fa);
}
int child::wait() {
    int st = 0;
    ::waitpid(pid, &st, 0);
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
child::~child() {
    if (pid > 0) {
        ::kill(pid, SIGTERM);
        ::waitpid(pid, nullptr, 0);
    }
    ::unlink(out.c_str());
    ::unlink(err.c_str());
}
long child::vm_hwm_kib() const {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line))
        if (line.starts_with("VmHWM:")) return std::atol(line.c_str() + 6);
    return -1;
}

}  // namespace vault_bench
