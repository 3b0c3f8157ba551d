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
// usage: node kube-play-prep.mjs MANIFEST OUTDIR NAME=HOSTPORT…
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { parseAllDocuments, stringify } from "yaml";

const [manifest, out, ...ports] = process.argv.slice(2);
const hostPort = Object.fromEntries(ports.map((p) => p.split("=")).map(([n, v]) => [n, Number(v)]));
const play = [];
const docs = parseAllDocuments(readFileSync(manifest, "utf8")).map((d) => d.toJS());
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
      }
    for (const c of spec.containers)
      for (const p of c.ports ?? []) {
        if (!hostPort[p.name]) throw new Error(`no host port given for ${c.name}/${p.name}`);
        p.hostPort = hostPort[p.name];
      }
    play.push(o);
  } else if (o.kind === "ConfigMap") {
    play.push(o);
  }
}
writeFileSync(`${out}/play.yaml`, play.map((o) => stringify(o)).join("---\n"));
