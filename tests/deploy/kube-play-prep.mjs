// Prepares deploy/kubernetes/chargeguard.yaml for `podman kube play` on a test machine (tests/container/run.sh).
// podman 4.3 reads a Secret in two ways: a secret volume (which it would mount still base64-encoded, so the
// decoded files are written under secret-files/NAME and mounted by hostPath instead), and secretKeyRef, which
// wants a podman secret holding the JSON map of its base64 `data` (write secret-NAME.json for
// `podman secret create`). The ConfigMap and Deployment are played as they are except for
// replicas 1 and each containerPort published on a free host port (podman publishes container ports, and a
// fixed port would collide with whatever the host runs). Other kinds (the PodDisruptionBudget; a Job, which
// podman kube play does not run) are left out.
// Native sidecars: podman 4.3 knows init containers only as run-to-completion steps (it ignores a
// container's restartPolicy and waits for each init container to exit before starting the others), so an
// init container with `restartPolicy: Always` would hold the pod forever. Each one becomes an ordinary
// container listed ahead of the app's, without restartPolicy: the same image, arguments, environment,
// mounts, ports, probes and security context. The shipped form is validated as it is by validate.mjs.
// The manifest holds no Secret: the Secrets and the ConfigMap it refers to are the ones the `kubectl create`
// lines of docs/operating/deployment.md's "kube-test: create" block make, built here from those lines as
// kubectl would, with the files they name taken from file:PATH=LOCAL arguments and the variables they expand
// from env:NAME=VALUE arguments. A ConfigMap volume is written out and mounted by hostPath like a Secret's.
// usage: node kube-play-prep.mjs MANIFEST DEPLOYMENT_MD OUTDIR NAME=HOSTPORT… file:PATH=LOCAL… env:NAME=VALUE…
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { parseAllDocuments, stringify } from "yaml";

const [manifest, guide, out, ...args] = process.argv.slice(2);
const kv = (prefix) => Object.fromEntries(args.filter((a) => a.startsWith(prefix))
  .map((a) => a.slice(prefix.length)).map((a) => [a.slice(0, a.indexOf("=")), a.slice(a.indexOf("=") + 1)]));
const hostPort = Object.fromEntries(Object.entries(kv("")).filter(([n]) => !n.includes(":")).map(([n, v]) => [n, Number(v)]));
const files = kv("file:");
const vars = kv("env:");
const play = [];
const docs = parseAllDocuments(readFileSync(manifest, "utf8")).map((d) => d.toJS());
const block = readFileSync(guide, "utf8").match(/<!-- kube-test: create -->\s*```sh\n([\s\S]*?)```/);
if (!block) throw new Error(`${guide}: no "kube-test: create" block`);
for (const line of block[1].split("\n").filter((l) => l.startsWith("kubectl create "))) {
  const m = line.match(/^kubectl create (secret generic|configmap) (\S+)(.*)$/);
  if (!m) throw new Error(`cannot read: ${line}`);
  const data = {};
  for (const [, how, key, raw] of m[3].matchAll(/--from-(file|literal)=([^=\s]+)=(\S+)/g)) {
    const value = raw.replace(/^"(.*)"$/, "$1").replace(/\$\{?(\w+)\}?/g, (_, v) => {
      if (!(v in vars)) throw new Error(`${line}: no env:${v}= given`);
      return vars[v];
    });
    let bytes;
    if (how === "file") {
      if (!(value in files)) throw new Error(`${line}: no file:${value}= given`);
      bytes = readFileSync(files[value]);
    } else bytes = Buffer.from(value);
    data[key] = m[1] === "configmap" ? bytes.toString("utf8") : bytes.toString("base64");
  }
  docs.push({ apiVersion: "v1", kind: m[1] === "configmap" ? "ConfigMap" : "Secret", metadata: { name: m[2] }, data,
    created: true });
}
// Secrets first: the Deployment's secret volumes are rewritten below, after their files are written.
docs.sort((a, b) => (b.kind === "Secret") - (a.kind === "Secret"));
for (const o of docs) {
  if (o.kind === "Secret") {
    const text = JSON.stringify(docs.find((x) => x.kind === "Deployment") ?? {});
    // A secret volume: podman 4.3 mounts a played Secret's `data` still base64-encoded, where a kubelet
    // mounts the decoded bytes. So the decoded files are written under secret-files/NAME and the volume
    // becomes a hostPath to them (below): the pod reads what Kubernetes would give it.
    if (text.includes(`"secretName":"${o.metadata.name}"`)) {
      const dir = `${out}/secret-files/${o.metadata.name}`;
      mkdirSync(dir, { recursive: true, mode: 0o755 });
      for (const [k, v] of Object.entries(o.data ?? {}))
        writeFileSync(`${dir}/${k}`, Buffer.from(v, "base64"), { mode: 0o444 });
    }
    if (text.includes(`"secretKeyRef":{"name":"${o.metadata.name}"`))
      writeFileSync(`${out}/secret-${o.metadata.name}.json`, JSON.stringify(o.data));
  } else if (o.kind === "Deployment") {
    o.spec.replicas = 1;
    const spec = o.spec.template.spec;
    const sidecars = (spec.initContainers ?? []).filter((c) => c.restartPolicy === "Always");
    if (sidecars.length) {
      spec.initContainers = spec.initContainers.filter((c) => c.restartPolicy !== "Always");
      if (!spec.initContainers.length) delete spec.initContainers;
      for (const c of sidecars) delete c.restartPolicy;
      spec.containers = [...sidecars, ...spec.containers];
    }
    for (const v of spec.volumes ?? [])
      if (v.secret) {
        v.hostPath = { path: `${out}/secret-files/${v.secret.secretName}`, type: "Directory" };
        delete v.secret;
      } else if (v.configMap) {
        const cm = docs.find((x) => x.kind === "ConfigMap" && x.metadata.name === v.configMap.name);
        if (!cm) throw new Error(`ConfigMap ${v.configMap.name}: neither in the manifest nor created by deployment.md`);
        const dir = `${out}/configmap-files/${cm.metadata.name}`;
        mkdirSync(dir, { recursive: true, mode: 0o755 });
        for (const [k, val] of Object.entries(cm.data ?? {})) writeFileSync(`${dir}/${k}`, val, { mode: 0o444 });
        v.hostPath = { path: dir, type: "Directory" };
        delete v.configMap;
      }
    for (const c of spec.containers)
      for (const p of c.ports ?? []) {
        if (!hostPort[p.name]) throw new Error(`no host port given for ${c.name}/${p.name}`);
        p.hostPort = hostPort[p.name];
      }
    play.push(o);
  } else if (o.kind === "ConfigMap" && !o.created) {
    play.push(o);
  }
}
writeFileSync(`${out}/play.yaml`, play.map((o) => stringify(o)).join("---\n"));
