{{/* Chart name, truncated: label values are limited to 63 characters. */}}
{{- define "tailguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; the release name alone when it already contains the chart name. */}}
{{- define "tailguard.fullname" -}}
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

{{- define "tailguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tailguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tailguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tailguard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tailguard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tailguard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tailguard.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "tailguard.tokenSecretName" -}}
{{- default (printf "%s-webhook" (include "tailguard.fullname" .)) .Values.webhook.existingSecret }}
{{- end }}

{{- define "tailguard.tokenSecretKey" -}}
{{- if .Values.webhook.existingSecret }}{{ .Values.webhook.existingSecretKey }}{{ else }}token{{ end }}
{{- end }}

{{- define "tailguard.apiSecretName" -}}
{{- default (printf "%s-api" (include "tailguard.fullname" .)) .Values.api.existingSecret }}
{{- end }}

{{- define "tailguard.apiSecretKey" -}}
{{- if .Values.api.existingSecret }}{{ .Values.api.existingSecretKey }}{{ else }}tokens.yaml{{ end }}
{{- end }}

{{- define "tailguard.controlConfigMap" -}}
{{- printf "%s-control" (include "tailguard.fullname" .) }}
{{- end }}

{{/* The Service URL (http or https), the default of api.externalUrl. */}}
{{- define "tailguard.url" -}}
{{- printf "%s://%s.%s.svc:%v" (ternary "https" "http" .Values.tls.enabled) (include "tailguard.fullname" .) .Release.Namespace .Values.service.port }}
{{- end }}

{{/* Where the journal lives: postgres, sqlite-pvc or sqlite-emptydir. */}}
{{- define "tailguard.journalMode" -}}
{{- if eq .Values.journal.backend "postgres" }}postgres
{{- else if .Values.journal.persistence.enabled }}sqlite-pvc
{{- else }}sqlite-emptydir
{{- end }}
{{- end }}

{{/* Mount points of the Secrets the config names as files. */}}
{{- define "tailguard.journalDsnDir" -}}/var/run/secrets/tailguard-journal{{- end }}
{{- define "tailguard.notificationsDir" -}}/var/run/secrets/tailguard-notifications{{- end }}

{{- define "tailguard.policiesConfigMapName" -}}
{{- default (printf "%s-policies" (include "tailguard.fullname" .)) .Values.existingPoliciesConfigMap }}
{{- end }}

{{- define "tailguard.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.leaseNamespace }}
{{- end }}

{{/* The ConfigMap that carries pins and guard history from one leader to the next. */}}
{{- define "tailguard.stateConfigMap" -}}
{{- default (printf "%s-state" .Values.leaderElection.leaseName) .Values.leaderElection.stateConfigMap }}
{{- end }}

{{/* Namespaces that get a Role: the listed ones, or the release namespace. JSON list. */}}
{{- define "tailguard.rbacNamespaces" -}}
{{- if .Values.rbac.namespaces }}{{ .Values.rbac.namespaces | uniq | toJson }}{{ else }}{{ list .Release.Namespace | toJson }}{{ end }}
{{- end }}

{{/*
Rules for acting on targets, derived only from the enabled actions, so that
disabling an action also takes its permission away. Leases are not here: they
live in one namespace, see rbac-leader-election.yaml.
*/}}
{{- define "tailguard.actionRules" -}}
# Every decision is recorded as a Kubernetes Event on the target.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
{{- with .Values.actions }}
{{- if .istio.enabled }}
# update as well as patch: weight shifts are read-modify-write with resourceVersion.
- apiGroups: [networking.istio.io]
  resources: [virtualservices]
  verbs: [get, patch, update]
{{- end }}
{{- if .httproute.enabled }}
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, patch]
{{- end }}
{{- if .configmap.enabled }}
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: {{ .configmap.names | uniq | toJson }}
  verbs: [get, patch]
{{- end }}
{{- if .scale.enabled }}
# kubernetes.scale: patch a Deployment's replicas, or the minReplicas of the HPA that scales it
# (list: the HPA is found by its scaleTargetRef). No scale subresource: the patch tests resourceVersion.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, patch]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, list, patch]
{{- end }}
{{- if .tritonDiscovery.enabled }}
# list/watch, not get: EndpointSlice names are generated, so they are found by the
# kubernetes.io/service-name label.
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
{{- end }}
{{- end }}
{{- end }}

{{/* The daemon's config.yaml; its checksum rolls the pods when it changes. */}}
{{- define "tailguard.config" -}}
listen:
  host: 0.0.0.0
  port: 8080
  shutdownTimeoutSeconds: {{ .Values.shutdownTimeoutSeconds }}
  {{- if .Values.tls.enabled }}
  tls:
    certFile: /var/run/secrets/tailguard-tls/tls.crt
    keyFile: /var/run/secrets/tailguard-tls/tls.key
  {{- end }}
api:
  tokensFile: /var/run/secrets/tailguard-api/tokens.yaml
  externalUrl: {{ default (include "tailguard.url" .) .Values.api.externalUrl | quote }}
{{- if .Values.control.enabled }}
control:
  configMap: {{ include "tailguard.controlConfigMap" . | quote }}
  namespace: {{ .Release.Namespace | quote }}
  pollIntervalSeconds: {{ .Values.control.pollIntervalSeconds | toJson }}
{{- end }}
webhook:
  tokenFile: /var/run/secrets/tailguard/token
  maxBodyBytes: {{ int64 .Values.webhook.maxBodyBytes }}
  bodyReadTimeoutSeconds: {{ .Values.webhook.bodyReadTimeoutSeconds }}
  maxConcurrentRequests: {{ int64 .Values.webhook.maxConcurrentRequests }}
policies:
  path: /etc/tailguard/policies
  reloadIntervalSeconds: {{ .Values.policyReloadIntervalSeconds }}
journal:
  backend: {{ .Values.journal.backend }}
  {{- if eq .Values.journal.backend "postgres" }}
  dsnFile: {{ include "tailguard.journalDsnDir" . }}/dsn
  sharedPollSeconds: {{ .Values.journal.postgres.pollIntervalSeconds | toJson }}
  {{- else }}
  path: /var/lib/tailguard/journal.db
  {{- end }}
  maxPending: {{ .Values.journal.maxPending | toJson }}
  maxHistoryRows: {{ .Values.journal.maxHistoryRows | toJson }}
prometheus:
  url: {{ .Values.prometheus.url | quote }}
  timeoutSeconds: {{ .Values.prometheus.timeoutSeconds }}
{{- if .Values.alertmanager.url }}
alertmanager:
  url: {{ .Values.alertmanager.url | quote }}
  timeoutSeconds: {{ .Values.alertmanager.timeoutSeconds | toJson }}
{{- end }}
kubernetes:
  mode: in-cluster
leaderElection:
  enabled: {{ .Values.leaderElection.enabled }}
  leaseName: {{ .Values.leaderElection.leaseName | quote }}
  leaseNamespace: {{ include "tailguard.leaseNamespace" . | quote }}
  leaseDurationSeconds: {{ .Values.leaderElection.leaseDurationSeconds }}
  renewDeadlineSeconds: {{ .Values.leaderElection.renewDeadlineSeconds }}
  retryPeriodSeconds: {{ .Values.leaderElection.retryPeriodSeconds }}
  stateConfigMap: {{ include "tailguard.stateConfigMap" . | quote }}
{{- if gt (int .Values.sharding.shards) 1 }}
sharding:
  shards: {{ .Values.sharding.shards }}
{{- end }}
{{- /* toJson: numbers as plain decimals (the default printing gives 1e+06), null as null (off) */}}
executor:
  maxSignalAgeSeconds: {{ .Values.executor.maxSignalAgeSeconds | toJson }}
  escalationFreezeSeconds: {{ .Values.executor.escalationFreezeSeconds | toJson }}
  repinEscalateAfter: {{ .Values.executor.repinEscalateAfter | toJson }}
  repinWindowSeconds: {{ .Values.executor.repinWindowSeconds | toJson }}
  queueSize: {{ .Values.executor.queueSize | toJson }}
  notificationQueueSize: {{ .Values.executor.notificationQueueSize | toJson }}
blastRadius:
  maxTargetsPerWindow: {{ .Values.blastRadius.maxTargetsPerWindow | toJson }}
  windowSeconds: {{ .Values.blastRadius.windowSeconds | toJson }}
  commonCauseTargets: {{ .Values.blastRadius.commonCauseTargets | toJson }}
  commonCauseShare: {{ .Values.blastRadius.commonCauseShare | toJson }}
  commonCauseSpanSeconds: {{ .Values.blastRadius.commonCauseSpanSeconds | toJson }}
  quietHoldSeconds: {{ .Values.blastRadius.quietHoldSeconds | toJson }}
loops:
  restartInitialSeconds: {{ .Values.loops.restartInitialSeconds | toJson }}
  restartMaxSeconds: {{ .Values.loops.restartMaxSeconds | toJson }}
  maxCrashes: {{ .Values.loops.maxCrashes | toJson }}
  crashWindowSeconds: {{ .Values.loops.crashWindowSeconds | toJson }}
freeze: {{ .Values.freeze }}
{{- with .Values.notifications }}
notifications:
  {{- range $i, $n := . }}
  - urlFile: {{ include "tailguard.notificationsDir" $ }}/receiver-{{ $i }}
    {{- with $n.format }}
    format: {{ . }}
    {{- end }}
    {{- with $n.events }}
    events: {{ . | toJson }}
    {{- end }}
    {{- with $n.timeoutSeconds }}
    timeoutSeconds: {{ . | toJson }}
    {{- end }}
    {{- with $n.maxAttempts }}
    maxAttempts: {{ . | toJson }}
    {{- end }}
  {{- end }}
{{- end }}
log:
  format: {{ .Values.log.format }}
  level: {{ .Values.log.level }}
  access: {{ .Values.log.access | default "info" }}
{{- end }}

{{/*
Checks across values that JSON Schema cannot express readably. Included by
every workload template so `helm template` fails before anything renders.
*/}}
{{- define "tailguard.validate" -}}
{{- /* replicas > 1 with sqlite, and postgres without journal.postgres.existingSecret, are refused by values.schema.json. */}}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) }}
{{- fail "tls.enabled needs tls.existingSecret: a kubernetes.io/tls Secret with tls.crt and tls.key" }}
{{- end }}
{{- if and .Values.existingPoliciesConfigMap .Values.policies }}
{{- fail "set either policies or existingPoliciesConfigMap, not both" }}
{{- end }}
{{- if and .Values.actions.configmap.enabled (not .Values.actions.configmap.names) }}
{{- fail "actions.configmap.enabled needs actions.configmap.names: the daemon may only patch ConfigMaps named there" }}
{{- end }}
{{- $le := .Values.leaderElection }}
{{- if and $le.enabled (not (and (gt (int $le.leaseDurationSeconds) (int $le.renewDeadlineSeconds)) (gt (int $le.renewDeadlineSeconds) (int $le.retryPeriodSeconds)))) }}
{{- fail (printf "leaderElection needs leaseDurationSeconds > renewDeadlineSeconds > retryPeriodSeconds (got %v > %v > %v)" $le.leaseDurationSeconds $le.renewDeadlineSeconds $le.retryPeriodSeconds) }}
{{- end }}
{{- /* SIGTERM: webhook requests finish (shutdownTimeoutSeconds), then the leader hands its Lease back
(2 x retryPeriodSeconds + 1 s); all of it before the kubelet's SIGKILL. */}}
{{- $handBack := 0.0 }}
{{- if $le.enabled }}
{{- $handBack = addf 1 (mulf 2 $le.retryPeriodSeconds) }}
{{- end }}
{{- $shutdown := addf .Values.shutdownTimeoutSeconds $handBack }}
{{- if not (lt $shutdown (float64 .Values.terminationGracePeriodSeconds)) }}
{{- fail (printf "shutdownTimeoutSeconds (%v) plus the leader's Lease hand-back (%v s: 2 x leaderElection.retryPeriodSeconds + 1) must stay below terminationGracePeriodSeconds (%v), or the kubelet kills the daemon mid-shutdown" .Values.shutdownTimeoutSeconds $handBack .Values.terminationGracePeriodSeconds) }}
{{- end }}
{{- $names := dict }}
{{- range .Values.policies }}
{{- if hasKey $names .name }}
{{- fail (printf "policies: name %q is used twice" .name) }}
{{- end }}
{{- $_ := set $names .name true }}
{{- end }}
{{- end }}
