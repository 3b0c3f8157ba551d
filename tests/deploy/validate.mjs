// Offline validation of deploy/kubernetes/*.yaml: every document against the Kubernetes schemas
// (kubernetes-models; the PodMonitor against prometheus-operator's), plus the properties the sidecar relies
// on: a native sidecar (an init container with restartPolicy Always), its probes (startup on /startupz,
// liveness on /healthz, no readiness that could take the app out of its Service), grace period, secrets as
// files, non-root, read-only root, resources, migrations at start under the advisory lock, a
// PodDisruptionBudget and a PodMonitor selecting the pod's health port. Exit 0 when all hold.
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";
import { ConfigMap, Secret } from "kubernetes-models/v1";
import { Deployment } from "kubernetes-models/apps/v1";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { PodMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const dir = process.argv[2];
const models = { ConfigMap, Secret, Deployment, PodDisruptionBudget, PodMonitor };
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
const all = [...(pod.initContainers ?? []), ...(pod.containers ?? [])];
const cg = (pod.initContainers ?? []).find((c) => c.name === "chargeguard");
check(cg, "chargeguard as an init container (a native sidecar)");
check(!(pod.containers ?? []).some((c) => c.name === "chargeguard"), "chargeguard not among the app's containers");
check((pod.containers ?? []).length >= 1, "the billing app's container beside the sidecar");
check(pod.terminationGracePeriodSeconds > shutdown, `terminationGracePeriodSeconds > --shutdown-timeout (${shutdown})`);
check(pod.securityContext?.runAsNonRoot === true, "pod runAsNonRoot");
for (const c of all) {
  check(c.securityContext?.readOnlyRootFilesystem === true, `${c.name}: readOnlyRootFilesystem`);
  check(c.resources?.requests?.cpu && c.resources?.requests?.memory, `${c.name}: resource requests`);
  check(c.resources?.limits?.cpu && c.resources?.limits?.memory, `${c.name}: resource limits`);
  for (const e of c.env ?? []) check(!/KEY|PASSWORD|SECRET/.test(e.name) || e.valueFrom, `${c.name}: ${e.name} must come from a Secret`);
}
if (cg) {
  check(cg.restartPolicy === "Always", "the sidecar init container has restartPolicy Always (Kubernetes >= 1.29)");
  check(cg.livenessProbe?.httpGet?.path === "/healthz", "liveness on /healthz (the event loop)");
  check(cg.startupProbe?.httpGet?.path === "/startupz", "startup on /startupz (dependencies reachable once)");
  check(!cg.readinessProbe || cg.readinessProbe.httpGet?.path === "/healthz",
    "no readiness on dependency state (/readyz would take the app out of its Service)");
  check(!(cg.args ?? []).some((a) => a.includes("sk_") || a.includes("password")), "no secret on the command line");
  check(config.CHARGEGUARD_MIGRATE === "true" || (cg.args ?? []).includes("--migrate"),
    "consume migrates at start (under the advisory lock)");
  const keyFile = config.CHARGEGUARD_STRIPE_KEY_FILE ?? "";
  const mount = (cg.volumeMounts ?? []).find((m) => keyFile.startsWith(m.mountPath + "/"));
  check(mount?.readOnly, "the Stripe key file lies in a read-only mount");
  const vol = (pod.volumes ?? []).find((v) => v.name === mount?.name);
  check(vol?.secret?.secretName, "the Stripe key mount is a Secret volume");
  const port = (cg.ports ?? []).find((p) => p.name === "health")?.containerPort;
  check(config.CHARGEGUARD_HEALTH_LISTEN === `0.0.0.0:${port}`, "the health port the probes use is the one chargeguard listens on");
  const ann = deployment.spec.template.metadata?.annotations ?? {};
  check(ann["prometheus.io/scrape"] === "true" && ann["prometheus.io/port"] === String(port) &&
    ann["prometheus.io/path"] === "/metrics", "prometheus.io scrape annotations on the health port");
}
// Applying the manifest again (every release) must never overwrite a real key: it holds no Secret, and each
// Secret and ConfigMap it refers to but does not hold is created by a documented `kubectl create` command
// naming the same keys (docs/operating/deployment.md).
check(byKind("Secret").length === 0, "no Secret in the applied manifests (they would overwrite the real key)");
const guide = readFileSync(join(dir, "../../docs/operating/deployment.md"), "utf8");
const created = {};
for (const m of guide.matchAll(/^kubectl create (secret generic|configmap) (\S+)(.*)$/gm)) {
  created[m[2]] = [...m[3].matchAll(/--from-(?:file|literal)=([^=\s]+)=/g)].map((k) => k[1]);
}
const held = new Set(byKind("ConfigMap").map((c) => c.metadata.name));
const refs = [];
for (const v of pod.volumes ?? []) {
  if (v.secret) refs.push([v.secret.secretName, null]);
  if (v.configMap) refs.push([v.configMap.name, null]);
}
for (const c of all) {
  for (const e of c.env ?? []) {
    const r = e.valueFrom?.secretKeyRef ?? e.valueFrom?.configMapKeyRef;
    if (r) refs.push([r.name, r.key]);
  }
  for (const e of c.envFrom ?? []) refs.push([(e.secretRef ?? e.configMapRef).name, null]);
}
for (const [name, key] of refs) {
  if (held.has(name)) continue;
  check(created[name], `${name}: referenced by the Deployment, created by no \`kubectl create\` in deployment.md`);
  if (created[name] && key) check(created[name].includes(key), `${name}: deployment.md creates it without key ${key}`);
}
check(pod.automountServiceAccountToken === false, "automountServiceAccountToken: false (no API token in the pod)");
if (cg) {
  check(config.PGSSLMODE === "verify-full", "PGSSLMODE verify-full (require does not verify the server)");
  const ca = config.PGSSLROOTCERT ?? "";
  const caMount = (cg.volumeMounts ?? []).find((m) => ca.startsWith(m.mountPath + "/"));
  check(caMount?.readOnly && (pod.volumes ?? []).some((v) => v.name === caMount.name && (v.configMap || v.secret)),
    "PGSSLROOTCERT lies in a read-only ConfigMap or Secret mount");
  const keyVol = (pod.volumes ?? []).find((v) => v.secret);
  const mode = keyVol?.secret?.defaultMode;
  check(mode !== undefined && ((mode & 0o040) !== 0 && pod.securityContext?.fsGroup === 10001 || (mode & 0o004) !== 0),
    "the Stripe key file is readable by the image's user (group-readable with fsGroup 10001)");
}
const podLabels = deployment?.spec?.template?.metadata?.labels ?? {};
const selects = (sel) => Object.entries(sel?.matchLabels ?? {}).length > 0 &&
  Object.entries(sel.matchLabels).every(([k, v]) => podLabels[k] === v);
check(byKind("Job").length === 0, "no migrate Job (replicas migrate at start)");
const pdb = byKind("PodDisruptionBudget")[0];
check(pdb && selects(pdb.spec?.selector), "a PodDisruptionBudget selecting the billing pods");
check(pdb && (pdb.spec.maxUnavailable !== undefined || pdb.spec.minAvailable !== undefined), "the PodDisruptionBudget bounds disruptions");
const pm = byKind("PodMonitor")[0];
check(pm && selects(pm.spec?.selector), "a PodMonitor selecting the billing pods");
check(pm?.spec?.podMetricsEndpoints?.some((e) => e.port === "health" && e.path === "/metrics"),
  "the PodMonitor scrapes /metrics on the health port");
check(/chargeguard/.test(pm?.metadata?.name ?? ""), "the PodMonitor's name gives a job the alerts select (.*chargeguard.*)");
if (failures.length) {
  for (const f of failures) console.error("FAIL: " + f);
  process.exit(1);
}
console.log(`ok: ${docs.length} manifests valid (${docs.map((d) => d.kind).join(", ")})`);
