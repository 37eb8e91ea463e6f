{{/*
The fixed contract between the chart and the code: every server, its gRPC port, the name
its grpc.health.v1 service reports under, and whether it owns a database schema (and so
gets a migration Job). The agent is absent on purpose: it is a sidecar the podwatcher puts
into training pods, not a Deployment of this chart.
*/}}
{{- define "stride.catalog" -}}
admission:
  grpcPort: 50051
  healthService: stride.api.admission.v1.AdmissionService
  database: true
optimizer:
  grpcPort: 50052
  healthService: stride.api.optimizer.v1.OptimizerService
  database: true
executor:
  grpcPort: 50053
  healthService: stride.api.executor.v1.ExecutorService
  database: false
configdb:
  grpcPort: 50054
  healthService: stride.api.configdb.v1.ConfigDbService
  database: true
dispatcher:
  grpcPort: 50055
  healthService: stride.api.dispatcher.v1.DispatcherService
  database: true
ckptcache:
  grpcPort: 50056
  healthService: stride.api.ckptcache.v1.CheckpointCacheService
  database: false
podwatcher:
  grpcPort: 50057
  healthService: stride.api.podwatcher.v1.PodWatcherService
  database: true
{{- end }}

{{/* Chart name, overridable with nameOverride. */}}
{{- define "stride.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Release-scoped name prefix. A release already named like the chart ("stride") is not
repeated ("stride-stride").
*/}}
{{- define "stride.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of one component's objects. Call with (list $ "admission"). */}}
{{- define "stride.componentName" -}}
{{- $root := index . 0 }}
{{- printf "%s-%s" (include "stride.fullname" $root) (index . 1) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "stride.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. Call with (list $ "admission"). */}}
{{- define "stride.labels" -}}
{{- $root := index . 0 -}}
helm.sh/chart: {{ include "stride.chart" $root }}
{{ include "stride.selectorLabels" . }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/part-of: stride
{{- end }}

{{/* Labels that select one component's pods. Call with (list $ "admission"). */}}
{{- define "stride.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "stride.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* The image of one process. Call with (list $ "admission"). */}}
{{- define "stride.image" -}}
{{- $root := index . 0 }}
{{- $image := $root.Values.image }}
{{- printf "%s/%s:%s" (required "image.repository is required" $image.repository | trimSuffix "/") (index . 1) (default $root.Chart.AppVersion $image.tag) }}
{{- end }}

{{- define "stride.databaseSecretName" -}}
{{- default (include "stride.componentName" (list . "database")) .Values.database.existingSecret }}
{{- end }}

{{- define "stride.databaseSecretKey" -}}
{{- if .Values.database.existingSecret }}
{{- .Values.database.existingSecretKey }}
{{- else -}}
url
{{- end }}
{{- end }}

{{/*
"true" when gRPC runs with mutual TLS, "" for plain text. TLS is on by default;
tls.insecure=true is the one way to plain text (it wins over tls.enabled), and
tls.enabled=false without it fails the rendering instead of silently dropping TLS.
*/}}
{{- define "stride.tls" -}}
{{- $tls := .Values.tls | default dict }}
{{- if $tls.insecure }}
{{- else if $tls.enabled -}}
true
{{- else }}
{{- fail "tls.enabled=false: Stride runs gRPC with mutual TLS by default; plain text (no peer authentication) must be asked for with tls.insecure=true" }}
{{- end }}
{{- end }}

{{/* Where a container finds its TLS Secret (tls.crt, tls.key, ca.crt). */}}
{{- define "stride.tlsMountPath" -}}
/etc/stride/tls
{{- end }}

{{/* The kubernetes.io/tls Secret of one identity. Call with (list $ "admission"). */}}
{{- define "stride.tlsSecretName" -}}
{{- include "stride.componentName" (list (index . 0) (printf "%s-tls" (index . 1))) }}
{{- end }}

{{/*
Every identity that gets a certificate, as stride.runtime.certs issues them: the servers,
the training pods' agent sidecar and trainer, the CLI, "users", whose key signs user
tokens (no Deployment mounts its Secret: the administrator mints tokens with it,
`stride token create`), and "nats", for a NATS locked down with `stride bus config`.
*/}}
{{- define "stride.tlsIdentities" -}}
{{- $catalog := include "stride.catalog" . | fromYaml }}
{{- concat (keys $catalog | sortAlpha) (list "agent" "trainer" "cli" "users" "nats") | toJson }}
{{- end }}

{{/*
TLS settings of one server's container. STRIDE_TLS_IDENTITY names the service, so the
health probe running in its container presents that certificate and expects it back.
Call with (list $ "admission").
*/}}
{{- define "stride.tlsEnv" -}}
{{- $root := index . 0 }}
{{- $name := index . 1 }}
{{- $path := include "stride.tlsMountPath" $root }}
- name: STRIDE_TLS_IDENTITY
  value: {{ $name | quote }}
{{- if include "stride.tls" $root }}
- name: STRIDE_TLS_CERT_FILE
  value: {{ printf "%s/tls.crt" $path | quote }}
- name: STRIDE_TLS_KEY_FILE
  value: {{ printf "%s/tls.key" $path | quote }}
- name: STRIDE_TLS_CA_FILE
  value: {{ printf "%s/ca.crt" $path | quote }}
{{- else }}
- name: STRIDE_INSECURE
  value: "1"
{{- end }}
{{- end }}

{{/* Settings every process reads. */}}
{{- define "stride.commonEnv" -}}
- name: STRIDE_NATS_URL
  value: {{ required "nats.url is required" .Values.nats.url | quote }}
- name: STRIDE_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- with .Values.otlp.endpoint }}
- name: STRIDE_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{- define "stride.databaseEnv" -}}
- name: STRIDE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "stride.databaseSecretName" . }}
      key: {{ include "stride.databaseSecretKey" . }}
{{- end }}

{{/* Settings of one server. Call with (list $ "admission" $catalogEntry). */}}
{{- define "stride.serverEnv" -}}
{{- $root := index . 0 }}
{{- $name := index . 1 }}
{{- $spec := index . 2 }}
{{- $prefix := printf "STRIDE_%s_" (upper $name) }}
{{ include "stride.commonEnv" $root }}
{{ include "stride.tlsEnv" (list $root $name) | trim }}
- name: {{ $prefix }}GRPC_PORT
  value: {{ $spec.grpcPort | quote }}
- name: {{ $prefix }}METRICS_PORT
  value: {{ $root.Values.metrics.port | quote }}
{{- if $spec.database }}
{{ include "stride.databaseEnv" $root }}
{{- /* Migrations run in the pre-install/pre-upgrade Jobs, never in the servers. */}}
- name: {{ $prefix }}AUTO_MIGRATE
  value: "false"
{{- end }}
{{- if eq $name "ckptcache" }}
- name: STRIDE_CKPTCACHE_STORE_DIR
  value: {{ $root.Values.ckptcache.store.mountPath | quote }}
{{- end }}
{{- if eq $name "admission" }}
{{- /* A job without a profile is planned on what similar finished jobs measured. */}}
- name: STRIDE_ADMISSION_CONFIGDB_ADDRESS
  value: {{ printf "%s:50054" (include "stride.componentName" (list $root "configdb")) | quote }}
{{- if ($root.Values.admission).quotas }}
- name: STRIDE_ADMISSION_QUOTAS_FILE
  value: /etc/stride/quotas/quotas.yaml
{{- end }}
{{- with ($root.Values.admission).cluster }}
{{- /* Capacity pinned by the operator: node inventories do not change it. */}}
- name: STRIDE_ADMISSION_CAPACITY_SOURCE
  value: "settings"
{{- if .gpus }}
- name: STRIDE_ADMISSION_CLUSTER_GPUS
  value: {{ .gpus | quote }}
{{- end }}
{{- if .gpuTopology }}
- name: STRIDE_ADMISSION_CLUSTER_TOPOLOGY
  value: {{ .gpuTopology | quote }}
{{- end }}
{{- if .cpu }}
- name: STRIDE_ADMISSION_CLUSTER_CPU
  value: {{ .cpu | quote }}
- name: STRIDE_ADMISSION_CLUSTER_MEMORY_GIB
  value: {{ .memoryGiB | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- if eq $name "optimizer" }}
{{- /* Warm starts come from the config DB's similar finished jobs. */}}
- name: STRIDE_OPTIMIZER_CONFIGDB_ADDRESS
  value: {{ printf "%s:50054" (include "stride.componentName" (list $root "configdb")) | quote }}
{{- /* A plan beyond a job's share is asked of admission (its RequestShare). */}}
- name: STRIDE_OPTIMIZER_ADMISSION_ADDRESS
  value: {{ printf "%s:50051" (include "stride.componentName" (list $root "admission")) | quote }}
{{- with ($root.Values.optimizer).clusterCapacity }}
- name: STRIDE_OPTIMIZER_CLUSTER_CPU
  value: {{ .cpu | quote }}
- name: STRIDE_OPTIMIZER_CLUSTER_MEMORY_GIB
  value: {{ .memoryGiB | quote }}
{{- end }}
{{- end }}
{{- if eq $name "podwatcher" }}
{{- $ns := $root.Release.Namespace }}
- name: STRIDE_PODWATCHER_BACKEND
  value: kubernetes
- name: STRIDE_PODWATCHER_NAMESPACE
  value: {{ include "stride.podwatcherNamespace" $root | quote }}
- name: STRIDE_PODWATCHER_AGENT_IMAGE
  value: {{ include "stride.image" (list $root "agent") | quote }}
- name: STRIDE_PODWATCHER_TRAINER_IMAGE
  value: {{ include "stride.image" (list $root "trainer") | quote }}
{{- /* What the training pods' agents and trainers call: the in-cluster Services, by their
full names, since a StrideJob's pods run in its own namespace. */}}
- name: STRIDE_PODWATCHER_DISPATCHER_ADDRESS
  value: {{ printf "%s.%s.svc:50055" (include "stride.componentName" (list $root "dispatcher")) $ns | quote }}
- name: STRIDE_PODWATCHER_CKPTCACHE_ADDRESS
  value: {{ printf "%s.%s.svc:50056" (include "stride.componentName" (list $root "ckptcache")) $ns | quote }}
- name: STRIDE_PODWATCHER_ADMISSION_ADDRESS
  value: {{ printf "%s:50051" (include "stride.componentName" (list $root "admission")) | quote }}
{{- /* Training pods carry the release's training-pod labels (its NetworkPolicy selects
them); each job's policy admits the pod watcher by its own labels. */}}
- name: STRIDE_PODWATCHER_KUBE_POD_LABELS
  value: {{ include "stride.selectorLabels" (list $root "training-pod") | replace ": " "=" | replace "\n" "," | quote }}
- name: STRIDE_PODWATCHER_KUBE_PODWATCHER_LABELS
  value: {{ include "stride.selectorLabels" (list $root "podwatcher") | replace ": " "=" | replace "\n" "," | quote }}
{{- with $root.Values.podwatcher.nodeSelector }}
- name: STRIDE_PODWATCHER_KUBE_NODE_SELECTOR
  value: {{ . | quote }}
{{- end }}
- name: STRIDE_PODWATCHER_LEASE_NAME
  value: {{ include "stride.componentName" (list $root "podwatcher") | quote }}
{{- if include "stride.tls" $root }}
{{- /* The training pods' certificates (trainer and agent identities). */}}
- name: STRIDE_PODWATCHER_KUBE_TRAINER_TLS_SECRET
  value: {{ include "stride.tlsSecretName" (list $root "trainer") | quote }}
- name: STRIDE_PODWATCHER_KUBE_AGENT_TLS_SECRET
  value: {{ include "stride.tlsSecretName" (list $root "agent") | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "stride.podwatcherNamespace" -}}
{{- default .Release.Namespace .Values.podwatcher.namespace }}
{{- end }}

{{- define "stride.podwatcherServiceAccountName" -}}
{{- include "stride.componentName" (list . "podwatcher") }}
{{- end }}

{{/* Scheduling and pull settings shared by every pod spec. */}}
{{- define "stride.podScheduling" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
A probe of one health service name of the server. The kubelet's gRPC probe cannot present
a client certificate, so with TLS it is an exec probe: stride.runtime.healthcheck in the
container, as the service's own identity (STRIDE_TLS_IDENTITY). Call with
(list $ $catalogEntry $healthService).
*/}}
{{- define "stride.healthProbe" -}}
{{- $root := index . 0 }}
{{- $spec := index . 1 }}
{{- $service := index . 2 }}
{{- if include "stride.tls" $root }}
exec:
  command:
    - python
    - -m
    - stride.runtime.healthcheck
    - --address
    - {{ printf "127.0.0.1:%v" $spec.grpcPort | quote }}
    - --service
    - {{ $service | quote }}
{{- else }}
grpc:
  port: {{ $spec.grpcPort }}
  service: {{ $service | quote }}
{{- end }}
{{- end }}

{{/* A probe against the server's own health service. Call with (list $ $catalogEntry). */}}
{{- define "stride.grpcProbe" -}}
{{- include "stride.healthProbe" (list (index . 0) (index . 1) (index . 1).healthService) | trim }}
{{- end }}

{{/*
Liveness asks for the overall server status (service ""), which stays SERVING while the
process runs; the per-service name is readiness and drops while NATS or the database is
unreachable, which must take the pod out of rotation, not restart it.
Call with (list $ $catalogEntry).
*/}}
{{- define "stride.grpcLivenessProbe" -}}
{{- include "stride.healthProbe" (list (index . 0) (index . 1) "") | trim }}
{{- end }}
