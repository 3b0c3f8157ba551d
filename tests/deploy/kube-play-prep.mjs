// Prepares deploy/kubernetes/chargeguard.yaml for `podman kube play` on a test machine (tests/container/run.sh).
// podman 4.3 reads a Secret in two ways: a secret volume wants the Secret as `kube play` stores it (write
// secret-NAME.yaml and play it), secretKeyRef wants a podman secret holding the JSON map of its base64 `data`
// (write secret-NAME.json for `podman secret create`). The ConfigMap and Deployment are played as they are except for
// replicas 1 and each containerPort published on a free host port (podman publishes container ports, and a
// fixed port would collide with whatever the host runs). The Job is left out: podman kube play does not run
// Jobs. usage: node kube-play-prep.mjs MANIFEST OUTDIR NAME=HOSTPORT…
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
    for (const c of o.spec.template.spec.containers)
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
