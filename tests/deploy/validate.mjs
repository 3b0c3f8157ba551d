// Offline validation of deploy/kubernetes/*.yaml: every document against the Kubernetes schemas
// (kubernetes-models), plus the properties the sidecar relies on (probes, grace period, secrets as files,
// non-root, read-only root, resources, a once-per-release migrate Job). Exit 0 when all hold.
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";
import { ConfigMap, Secret } from "kubernetes-models/v1";
import { Deployment } from "kubernetes-models/apps/v1";
import { Job } from "kubernetes-models/batch/v1";

const dir = process.argv[2];
const models = { ConfigMap, Secret, Deployment, Job };
const failures = [];
const check = (ok, what) => { if (!ok) failures.push(what); };
const docs = [];
for (const f of readdirSync(dir).filter((f) => f.endsWith(".yaml"))) {
  for (const d of parseAllDocuments(readFileSync(join(dir, f), "utf8"))) {
    if (d.errors.length) { failures.push(`${f}: ${d.errors[0].message}`); continue; }
    const obj = d.toJS();
    const Model = models[obj.kind];
    if (!Model) { failures.push(`${f}: unexpected kind ${obj.kind}`); continue; }
    try { new Model(obj).validate(); } catch (e) { failures.push(`${f}: ${obj.kind}/${obj.metadata?.name}: ${e.message}`); }
    docs.push(obj);
  }
}
const byKind = (k) => docs.filter((d) => d.kind === k);
const config = byKind("ConfigMap")[0]?.data ?? {};
const shutdown = Number(config.CHARGEGUARD_SHUTDOWN_TIMEOUT ?? 30);
const deployment = byKind("Deployment")[0];
check(deployment, "a Deployment");
const pod = deployment?.spec?.template?.spec ?? {};
const cg = (pod.containers ?? []).find((c) => c.name === "chargeguard");
check(cg, "a chargeguard container");
check((pod.containers ?? []).length >= 2, "the billing app's container beside the sidecar");
check(pod.terminationGracePeriodSeconds > shutdown, `terminationGracePeriodSeconds > --shutdown-timeout (${shutdown})`);
check(pod.securityContext?.runAsNonRoot === true, "pod runAsNonRoot");
for (const c of pod.containers ?? []) {
  check(c.securityContext?.readOnlyRootFilesystem === true, `${c.name}: readOnlyRootFilesystem`);
  check(c.resources?.requests?.cpu && c.resources?.requests?.memory, `${c.name}: resource requests`);
  check(c.resources?.limits?.cpu && c.resources?.limits?.memory, `${c.name}: resource limits`);
  for (const e of c.env ?? []) check(!/KEY|PASSWORD|SECRET/.test(e.name) || e.valueFrom, `${c.name}: ${e.name} must come from a Secret`);
}
if (cg) {
  check(cg.livenessProbe?.httpGet?.path === "/healthz", "liveness on /healthz");
  check(cg.readinessProbe?.httpGet?.path === "/readyz", "readiness on /readyz");
  check(cg.startupProbe?.httpGet, "a startup probe");
  check(!(cg.args ?? []).some((a) => a.includes("sk_") || a.includes("password")), "no secret on the command line");
  check(!(cg.args ?? []).includes("--migrate"), "consume does not migrate (the Job does)");
  const keyFile = config.CHARGEGUARD_STRIPE_KEY_FILE ?? "";
  const mount = (cg.volumeMounts ?? []).find((m) => keyFile.startsWith(m.mountPath + "/"));
  check(mount?.readOnly, "the Stripe key file lies in a read-only mount");
  const vol = (pod.volumes ?? []).find((v) => v.name === mount?.name);
  check(vol?.secret?.secretName, "the Stripe key mount is a Secret volume");
  const port = (cg.ports ?? []).find((p) => p.name === "health")?.containerPort;
  check(config.CHARGEGUARD_HEALTH_LISTEN === `0.0.0.0:${port}`, "the health port the probes use is the one chargeguard listens on");
}
const job = byKind("Job")[0];
check(job?.spec?.template?.spec?.containers?.[0]?.args?.[0] === "migrate", "a migrate Job");
check(/\d+-\d+-\d+$/.test(job?.metadata?.name ?? ""), "the migrate Job's name carries the release");
if (failures.length) {
  for (const f of failures) console.error("FAIL: " + f);
  process.exit(1);
}
console.log(`ok: ${docs.length} manifests valid (${docs.map((d) => d.kind).join(", ")})`);
