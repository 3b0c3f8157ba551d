// Prepares deploy/kubernetes/chargeguard.yaml for `podman kube play` on a test machine (tests/container/run.sh).
// podman 4.3 reads a Secret in two ways: a secret volume wants the Secret as `kube play` stores it (write
// secret-NAME.yaml and play it), secretKeyRef wants a podman secret holding the JSON map of its base64 `data`
// (write secret-NAME.json for `podman secret create`). The ConfigMap and Deployment are played as they are except for
// replicas 1 and each containerPort published on a free host port (podman publishes container ports, and a
// fixed port would collide with whatever the host runs). Other kinds (the PodDisruptionBudget; a Job, which
// podman kube play does not run) are left out.
// Native sidecars: podman 4.3 knows init containers only as run-to-completion steps (it ignores a
// container's restartPolicy and waits for each init container to exit before starting the others), so an
// init container with `restartPolicy: Always` would hold the pod forever. Each one becomes an ordinary
// container listed ahead of the app's, without restartPolicy: the same image, arguments, environment,
// mounts, ports, probes and security context. The shipped form is validated as it is by validate.mjs.
// usage: node kube-play-prep.mjs MANIFEST OUTDIR NAME=HOSTPORT…
import { readFileSync, writeFileSync } from "node:fs";
import { parseAllDocuments, stringify } from "yaml";

const [manifest, out, ...ports] = process.argv.slice(2);
const hostPort = Object.fromEntries(ports.map((p) => p.split("=")).map(([n, v]) => [n, Number(v)]));
const play = [];
const docs = parseAllDocuments(readFileSync(manifest, "utf8")).map((d) => d.toJS());
for (const o of docs) {
  if (o.kind === "Secret") {
    const text = JSON.stringify(docs.find((x) => x.kind === "Deployment") ?? {});
    if (text.includes(`"secretName":"${o.metadata.name}"`)) writeFileSync(`${out}/secret-${o.metadata.name}.yaml`, stringify(o));
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
