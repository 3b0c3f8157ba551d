"""Network namespaces for partition tests: a private bridge, one namespace per worker, and cuts.

The test owns everything it creates and removes it at the end, also on failure (call close() from a
finally/atexit; it is idempotent and removes whatever exists):

  host  ── bridge <br> (HOST_IP/24) ── veth ── namespace <ns_i> (eth0, .10+i/24, lo)

Services (PostgreSQL, nsqd, fake-stripe) listen on HOST_IP; each worker runs in its own namespace and
reaches them over the bridge. The namespaces get no default route (nothing beyond the subnet is
reachable), and an nft table on the host drops anything forwarded to or from the bridge.

A cut is made inside one worker's namespace, so it affects that worker only:
  * cut_port(i, port): nft DROP of the service's TCP port, both directions (packets are silently lost,
    like a partition, not refused);
  * cut_all(i): the namespace's link set down (everything unreachable).
heal(i) undoes both.
"""

import os
import shutil
import subprocess


class Unavailable(Exception):
    """Network namespaces cannot be used here (not root, no ip/nft, no permission)."""


def _run(*args, check=True, ns=None):
    cmd = list(args)
    if ns is not None:
        cmd = ["ip", "netns", "exec", ns] + cmd
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), r.stderr.strip()))
    return r


def check_available():
    """Raises Unavailable with the reason when this machine cannot run the partition test."""
    if os.geteuid() != 0:
        raise Unavailable("not root (network namespaces, veth, bridges and nft need root)")
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            raise Unavailable("%s is not installed" % tool)
    probe = "cgp-probe-%d" % os.getpid()
    r = _run("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        raise Unavailable("ip netns add failed: %s" % r.stderr.strip())
    _run("ip", "netns", "del", probe, check=False)


class Net:
    def __init__(self, workers, tag=None):
        self.tag = tag or "%04x" % (os.getpid() & 0xFFFF)
        # A /24 unlikely to collide with another run: 10.231.<20..219>.0/24.
        self.octet = 20 + (int(self.tag, 16) % 200)
        self.host_ip = "10.231.%d.1" % self.octet
        self.bridge = "cgpb%s" % self.tag
        self.table = "cgp_%s" % self.tag
        self.ns = ["cgp-%s-%d" % (self.tag, i) for i in range(workers)]
        self.veth_host = ["cgph%s%d" % (self.tag, i) for i in range(workers)]
        self.ip = ["10.231.%d.%d" % (self.octet, 10 + i) for i in range(workers)]
        self.cut_state = [set() for _ in range(workers)]  # what is cut in each namespace
        self.created = False

    def up(self):
        self.created = True
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", self.host_ip + "/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        # Nothing forwarded to or from the test bridge leaves it.
        _run("nft", "add", "table", "inet", self.table)
        _run("nft", "add", "chain", "inet", self.table, "forward",
             "{ type filter hook forward priority 0 ; policy accept ; }")
        _run("nft", "add", "rule", "inet", self.table, "forward", "iifname", self.bridge, "drop")
        _run("nft", "add", "rule", "inet", self.table, "forward", "oifname", self.bridge, "drop")
        for i, ns in enumerate(self.ns):
            peer = "cgpn%s%d" % (self.tag, i)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", self.veth_host[i], "type", "veth", "peer", "name", peer)
            _run("ip", "link", "set", self.veth_host[i], "master", self.bridge)
            _run("ip", "link", "set", self.veth_host[i], "up")
            _run("ip", "link", "set", peer, "netns", ns)
            _run("ip", "link", "set", peer, "name", "eth0", ns=ns)
            _run("ip", "addr", "add", self.ip[i] + "/24", "dev", "eth0", ns=ns)
            _run("ip", "link", "set", "eth0", "up", ns=ns)
            _run("ip", "link", "set", "lo", "up", ns=ns)
            # The cut table: empty chains now, rules added per cut.
            _run("nft", "add", "table", "inet", "cut", ns=ns)
            _run("nft", "add", "chain", "inet", "cut", "input",
                 "{ type filter hook input priority 0 ; policy accept ; }", ns=ns)
            _run("nft", "add", "chain", "inet", "cut", "output",
                 "{ type filter hook output priority 0 ; policy accept ; }", ns=ns)

    def exec_prefix(self, i):
        return ["ip", "netns", "exec", self.ns[i]]

    def cut_port(self, i, port):
        _run("nft", "add", "rule", "inet", "cut", "input", "ip", "saddr", self.host_ip, "tcp", "sport",
             str(port), "drop", ns=self.ns[i])
        _run("nft", "add", "rule", "inet", "cut", "output", "ip", "daddr", self.host_ip, "tcp", "dport",
             str(port), "drop", ns=self.ns[i])
        self.cut_state[i].add(port)

    def cut_all(self, i):
        _run("ip", "link", "set", "eth0", "down", ns=self.ns[i])
        self.cut_state[i].add("link")

    def heal(self, i):
        _run("nft", "flush", "chain", "inet", "cut", "input", ns=self.ns[i], check=False)
        _run("nft", "flush", "chain", "inet", "cut", "output", ns=self.ns[i], check=False)
        if "link" in self.cut_state[i]:
            _run("ip", "link", "set", "eth0", "up", ns=self.ns[i], check=False)
            # Link down removed the subnet route; up restores it with the address.
        self.cut_state[i].clear()

    def close(self):
        """Removes namespaces (their veth ends go with them), the bridge and the nft table. Idempotent."""
        if not self.created:
            return
        for i, ns in enumerate(self.ns):
            _run("ip", "link", "del", self.veth_host[i], check=False)
            _run("ip", "netns", "del", ns, check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        _run("nft", "delete", "table", "inet", self.table, check=False)
        self.created = False

    def leftovers(self):
        """Anything of ours still present (for the test's own cleanup check)."""
        out = []
        names = _run("ip", "netns", "list", check=False).stdout
        out += [ns for ns in self.ns if ns in names]
        links = _run("ip", "-o", "link", "show", check=False).stdout
        out += [l for l in [self.bridge] + self.veth_host if (" %s:" % l) in links or (" %s@" % l) in links]
        tables = _run("nft", "list", "tables", check=False).stdout
        if self.table in tables:
            out.append("nft table " + self.table)
        return out
