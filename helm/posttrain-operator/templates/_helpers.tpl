{{/*
Chart name, truncated to 63 characters (the DNS label limit).
*/}}
{{- define "posttrain-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: `<release>-<chart>` unless the release name already holds the chart name; 63 characters
at most. Component names add a suffix, so they truncate the prefix to leave room for it.
*/}}
{{- define "posttrain-operator.fullname" -}}
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

{{/*
`<fullname>-<component>`, 63 characters at most: the fullname is cut, never the component suffix.
Usage: include "posttrain-operator.componentName" (list . "operator")
*/}}
{{- define "posttrain-operator.componentName" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- $prefix := include "posttrain-operator.fullname" $root | trunc (int (sub 62 (len $component))) | trimSuffix "-" }}
{{- printf "%s-%s" $prefix $component }}
{{- end }}

{{- define "posttrain-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels.
*/}}
{{- define "posttrain-operator.labels" -}}
helm.sh/chart: {{ include "posttrain-operator.chart" . }}
{{ include "posttrain-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: posttrain-operator
{{- end }}

{{/*
Selector labels (immutable once deployed: keep them few).
*/}}
{{- define "posttrain-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "posttrain-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "posttrain-operator.operatorSelectorLabels" -}}
{{ include "posttrain-operator.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "posttrain-operator.gatewaySelectorLabels" -}}
{{ include "posttrain-operator.selectorLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* The `helm test` probe's pod (no token): the one test pod the NetworkPolicies let in. */}}
{{- define "posttrain-operator.testSelectorLabels" -}}
{{ include "posttrain-operator.selectorLabels" . }}
app.kubernetes.io/component: test-probe
{{- end }}

{{- define "posttrain-operator.operatorServiceAccountName" -}}
{{- default (include "posttrain-operator.componentName" (list . "operator")) .Values.operator.serviceAccount.name }}
{{- end }}

{{- define "posttrain-operator.gatewayServiceAccountName" -}}
{{- default (include "posttrain-operator.componentName" (list . "gateway")) .Values.gateway.serviceAccount.name }}
{{- end }}

{{/* The Kubernetes usernames of the two identities (RBAC subjects, the broker's allow-list, the VAP). */}}
{{- define "posttrain-operator.operatorUsername" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "posttrain-operator.operatorServiceAccountName" .) }}
{{- end }}

{{- define "posttrain-operator.gatewayUsername" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "posttrain-operator.gatewayServiceAccountName" .) }}
{{- end }}

{{- define "posttrain-operator.gatewayEpisodeNamespace" -}}
{{- default .Release.Namespace .Values.gateway.episodeNamespace }}
{{- end }}

{{- define "posttrain-operator.orchestratorSecretName" -}}
{{- default (include "posttrain-operator.componentName" (list . "orchestrator-token")) .Values.gateway.orchestratorTokenSecret.name }}
{{- end }}

{{- define "posttrain-operator.brokerServiceName" -}}
{{- include "posttrain-operator.componentName" (list . "broker") }}
{{- end }}

{{- define "posttrain-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The container security context every container of the chart gets.
*/}}
{{- define "posttrain-operator.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 10000
runAsGroup: 10000
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "posttrain-operator.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10000
runAsGroup: 10000
fsGroup: 10000
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
The operator's application rules: the same list for its ClusterRole (all namespaces) or for a Role
in each watched namespace.
*/}}
{{- define "posttrain-operator.operatorRules" -}}
# Application: the operator's own resources. kopf watches them and patches finalizers and its
# progress annotations; the reconcilers read, create score jobs and label/patch jobs.
- apiGroups: ["posttrain.dev"]
  resources: ["episodes", "agentjobs", "judgefindings"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["posttrain.dev"]
  resources: ["agentjobs"]
  verbs: ["create"]
# Application: each terminal job and the submission, appended to the Episode's provenance (never
# changed or deleted: the Episode's ownerReference deletes them); list sums them up at the end.
- apiGroups: ["posttrain.dev"]
  resources: ["provenancerecords"]
  verbs: ["list", "create"]
# Application: each namespace's BudgetQuota, read at admission and kept current (never its spec).
- apiGroups: ["posttrain.dev"]
  resources: ["budgetquotas"]
  verbs: ["get", "list"]
# Application: the ledgers are compare-and-swaps (replace) of Episode and BudgetQuota status; job
# status is patched.
- apiGroups: ["posttrain.dev"]
  resources: ["episodes/status", "budgetquotas/status"]
  verbs: ["update"]
- apiGroups: ["posttrain.dev"]
  resources: ["agentjobs/status", "judgefindings/status"]
  verbs: ["patch"]
# Application: owner references with blockOwnerDeletion (OwnerReferencesPermissionEnforcement).
- apiGroups: ["posttrain.dev"]
  resources: ["episodes/finalizers", "agentjobs/finalizers"]
  verbs: ["update"]
# Framework and application: Events (kopf's warnings, the operator's own).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Application: the agent-token Secret of an Episode created without spec.agentTokenHash. `create`
# cannot be limited by name; `get` is used only when a create found the Secret already there (a
# retry after a crash). RBAC cannot restrict either to Secrets the operator owns. No list, watch,
# update or delete: the Episode's ownerReference deletes the Secret.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "get"]
{{- end }}

{{/* The admission policy that refuses unregistered tasks; the operator writes its task list into it. */}}
{{- define "posttrain-operator.taskPolicyName" -}}
{{- include "posttrain-operator.componentName" (list . "tasks") }}
{{- end }}

{{/* Where the tasks' repos are and the most their jobs may ask for: the operator and the gateway
load the same task registry and must agree on both. */}}
{{- define "posttrain-operator.taskEnv" -}}
- name: POSTTRAIN_TASK_ASSETS_NAMESPACE
  value: {{ .Values.tasks.assetsNamespace | quote }}
- name: POSTTRAIN_TASK_ASSETS_REVISION
  value: {{ .Values.tasks.assetsRevision | quote }}
{{- range $key, $value := .Values.tasks.jobLimitMaxima }}
- name: POSTTRAIN_MAX_JOB_{{ snakecase $key | upper }}
  value: {{ $value | int64 | toString | quote }}
{{- end }}
{{- range $name, $value := .Values.tasks.settings }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}

{{/* The hosts the gateway's Ingress and HTTPRoute route to it (a JSON list), when they are enabled. */}}
{{- define "posttrain-operator.gatewayExternalHosts" -}}
{{- $hosts := list }}
{{- if .Values.gateway.ingress.enabled }}
{{- $hosts = concat $hosts .Values.gateway.ingress.hosts }}
{{- range .Values.gateway.ingress.tls }}
{{- $hosts = concat $hosts (default (list) .hosts) }}
{{- end }}
{{- end }}
{{- if .Values.gateway.httpRoute.enabled }}
{{- $hosts = concat $hosts .Values.gateway.httpRoute.hostnames }}
{{- end }}
{{- uniq $hosts | toJson }}
{{- end }}

{{/* The Host headers the gateway accepts (a JSON list): gateway.allowedHosts, or the Service's
in-cluster names and loopback; with the hosts its Ingress and HTTPRoute route to it. */}}
{{- define "posttrain-operator.gatewayAllowedHosts" -}}
{{- $svc := include "posttrain-operator.componentName" (list . "gateway") }}
{{- $ns := .Release.Namespace }}
{{- $hosts := .Values.gateway.allowedHosts }}
{{- if not $hosts }}
{{- $hosts = list $svc (printf "%s:*" $svc) (printf "%s.%s" $svc $ns) (printf "%s.%s:*" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc:*" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) (printf "%s.%s.svc.cluster.local:*" $svc $ns) "127.0.0.1:*" "localhost:*" }}
{{- end }}
{{- /* The hosts an Ingress or HTTPRoute routes here are accepted too, with any port. */}}
{{- range (include "posttrain-operator.gatewayExternalHosts" . | fromJsonArray) }}
{{- $hosts = concat $hosts (list . (printf "%s:*" .)) }}
{{- end }}
{{- $hosts = uniq $hosts }}
{{- $hosts | toJson }}
{{- end }}
