{{/* vim: set filetype=mustache: */}}
{{/*
The chart name, or nameOverride.
*/}}
{{- define "labkube.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The full name of the chart's objects.
We truncate at 63 chars because some Kubernetes name fields are limited to this (by the DNS
naming spec), and the name is also used as a label value, which has the same limit.
If the release name contains the chart name it is used as the full name.
*/}}
{{- define "labkube.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "labkube.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Labels of every object of the release.
*/}}
{{- define "labkube.labels" -}}
helm.sh/chart: {{ include "labkube.chart" . }}
{{ include "labkube.selectorLabels" . }}
app.kubernetes.io/part-of: labkube
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- include "labkube.commonLabels" . }}
{{- end -}}

{{/*
`commonLabels`, each on a line of its own after a newline (nothing when there are none).
*/}}
{{- define "labkube.commonLabels" -}}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Keys of the labels the chart sets itself: `commonLabels` and `rayCluster.labels` may not name them (a key twice
in one map is an error at install).
*/}}
{{- define "labkube.ownLabelKeys" -}}
{{- list "helm.sh/chart" "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/component" "app.kubernetes.io/part-of" "app.kubernetes.io/version" "app.kubernetes.io/managed-by" | toJson -}}
{{- end -}}

{{/*
Labels that select the operator pod (never change them on upgrade: a Deployment's selector is immutable).
*/}}
{{- define "labkube.selectorLabels" -}}
app.kubernetes.io/name: {{ include "labkube.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/*
Labels of the release's objects that concern run pods (NetworkPolicy, PodMonitor).
*/}}
{{- define "labkube.runObjectLabels" -}}
helm.sh/chart: {{ include "labkube.chart" . }}
app.kubernetes.io/name: {{ include "labkube.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: run
app.kubernetes.io/part-of: labkube
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- include "labkube.commonLabels" . }}
{{- end -}}

{{/*
Labels that select run pods: what labkube.operator.pod_manifest.run_labels sets on every one.
*/}}
{{- define "labkube.runSelectorLabels" -}}
app.kubernetes.io/name: labkube
app.kubernetes.io/part-of: labkube
app.kubernetes.io/component: run
{{- end -}}

{{/*
The operator's ServiceAccount.
*/}}
{{- define "labkube.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "labkube.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
An image reference from (list <image values> <appVersion>): `repository@digest` when a digest is set, else
`repository:tag` (tag default: the chart's appVersion).
*/}}
{{- define "labkube.imageRef" -}}
{{- $image := index . 0 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default (index . 1) $image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The operator image, and the default image of run pods.
*/}}
{{- define "labkube.image" -}}
{{- include "labkube.imageRef" (list .Values.image .Chart.AppVersion) -}}
{{- end -}}

{{/*
The RayCluster's image and pull policy: rayCluster.image, else the operator's.
*/}}
{{- define "labkube.rayImage" -}}
{{- if .Values.rayCluster.image.repository -}}
{{- include "labkube.imageRef" (list .Values.rayCluster.image .Chart.AppVersion) -}}
{{- else -}}
{{- include "labkube.image" . -}}
{{- end -}}
{{- end -}}

{{- define "labkube.rayPullPolicy" -}}
{{- default .Values.image.pullPolicy .Values.rayCluster.image.pullPolicy -}}
{{- end -}}

{{- define "labkube.runImage" -}}
{{- if .Values.runs.image.repository -}}
{{- printf "%s:%s" .Values.runs.image.repository (default .Chart.AppVersion .Values.runs.image.tag) -}}
{{- else -}}
{{- include "labkube.image" . -}}
{{- end -}}
{{- end -}}

{{/*
Namespaces with run pods: the watched ones, or the release namespace when watching all.
*/}}
{{- define "labkube.runNamespaces" -}}
{{- if .Values.operator.watchNamespaces -}}
{{- toJson .Values.operator.watchNamespaces -}}
{{- else -}}
{{- list .Release.Namespace | toJson -}}
{{- end -}}
{{- end -}}

{{/*
Does the operator create a PersistentVolumeClaim per run?
*/}}
{{- define "labkube.claimPerRun" -}}
{{- if and (eq .Values.runs.workspace.mode "pvc") (not .Values.runs.workspace.existingClaim) -}}true{{- end -}}
{{- end -}}

{{/*
Checks values.schema.json cannot express. Every message names the key and the bad value.
*/}}
{{- define "labkube.validateConfig" -}}
{{- if and .Values.networkPolicy.allowedHosts (not .Values.networkPolicy.cilium) }}
{{- fail (printf "networkPolicy.allowedHosts is %v, but a Kubernetes NetworkPolicy matches only addresses: set networkPolicy.cilium=true, or allow an egress proxy in networkPolicy.allowedCIDRs" .Values.networkPolicy.allowedHosts) }}
{{- end }}
{{- if and .Values.networkPolicy.cilium (not .Values.networkPolicy.enabled) }}
{{- fail "networkPolicy.cilium is true but networkPolicy.enabled is false: enable the NetworkPolicy too" }}
{{- end }}
{{- if eq (int .Values.operator.metricsPort) (int .Values.operator.healthPort) }}
{{- fail (printf "operator.metricsPort and operator.healthPort are both %v: use two ports" .Values.operator.metricsPort) }}
{{- end }}
{{- if and .Values.runs.world.image (eq (int .Values.runs.world.port) (int .Values.runs.metricsPort)) }}
{{- fail (printf "runs.world.port and runs.metricsPort are both %v: use two ports" .Values.runs.metricsPort) }}
{{- end }}
{{- range .Values.networkPolicy.allowedCIDRs }}
{{- if or (hasPrefix "169.254." .) (hasPrefix "fe80:" (lower .)) (hasPrefix "fd00:ec2:" (lower .)) }}
{{- fail (printf "networkPolicy.allowedCIDRs has %s, a link-local range holding the cloud metadata service: remove it" .) }}
{{- end }}
{{- end }}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.operator.leaderElection.enabled) }}
{{- fail (printf "operator.replicas is %d but operator.leaderElection.enabled is false: two unfenced operators would drive the same Campaigns; enable leader election or set replicas to 1" (int .Values.operator.replicas)) }}
{{- end }}
{{- if ge (float64 .Values.operator.leaderElection.renewDeadlineSeconds) (float64 .Values.operator.leaderElection.leaseSeconds) }}
{{- fail (printf "operator.leaderElection.renewDeadlineSeconds (%v) must be less than leaseSeconds (%v): a leader must stop before another may take over" .Values.operator.leaderElection.renewDeadlineSeconds .Values.operator.leaderElection.leaseSeconds) }}
{{- end }}
{{- if and .Values.runs.workspace.existingClaim (ne .Values.runs.workspace.mode "pvc") }}
{{- fail (printf "runs.workspace.existingClaim is %q but runs.workspace.mode is %q: set mode to pvc" .Values.runs.workspace.existingClaim .Values.runs.workspace.mode) }}
{{- end }}
{{- if eq .Values.runs.workspace.mode "emptyDir" }}
{{- fail "runs.workspace.mode is emptyDir: a run is graded in a pod of its own after its agent's pod ends, and an emptyDir ends with that pod; set runs.workspace.mode to pvc (a claim per run, or existingClaim)" }}
{{- end }}
{{- range $name, $_ := .Values.runs.env }}
{{- if regexMatch "(?i)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)" $name }}
{{- fail (printf "runs.env.%s looks like a secret: put it in a Secret and list it in runs.apiKeys" $name) }}
{{- end }}
{{- end }}
{{- if .Values.rayCluster.enabled }}
{{- if .Values.operator.rayAddress }}
{{- fail (printf "rayCluster.enabled is true and operator.rayAddress is %q: use the chart's RayCluster or an existing cluster, not both" .Values.operator.rayAddress) }}
{{- end }}
{{- if not .Values.runs.workspace.existingClaim }}
{{- fail "rayCluster.enabled needs runs.workspace.existingClaim: the Ray workers that supervise runs write their run directories to the claim the operator reads (a ReadWriteMany claim)" }}
{{- end }}
{{- $w := .Values.rayCluster.workers }}
{{- if or (gt (int $w.minReplicas) (int $w.replicas)) (gt (int $w.replicas) (int $w.maxReplicas)) }}
{{- fail (printf "rayCluster.workers: need minReplicas (%d) <= replicas (%d) <= maxReplicas (%d)" (int $w.minReplicas) (int $w.replicas) (int $w.maxReplicas)) }}
{{- end }}
{{- end }}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) .Values.rbac.create }}
{{- fail "rbac.create is true but serviceAccount.create is false and serviceAccount.name is empty: name the ServiceAccount to bind" }}
{{- end }}
{{- $ownLabels := include "labkube.ownLabelKeys" . | fromJsonArray }}
{{- range $key, $_ := .Values.commonLabels }}
{{- if has $key $ownLabels }}
{{- fail (printf "commonLabels.%s is a label the chart sets itself: remove it from commonLabels" $key) }}
{{- end }}
{{- end }}
{{- range $key, $_ := .Values.rayCluster.labels }}
{{- if or (has $key $ownLabels) (hasKey (default dict $.Values.commonLabels) $key) }}
{{- fail (printf "rayCluster.labels.%s is set by the chart or by commonLabels: remove it from rayCluster.labels" $key) }}
{{- end }}
{{- end }}
{{- $chartVolumes := list "config" "tmp" "dshm" "runs" }}
{{- range .Values.operator.extraVolumes }}
{{- if has .name $chartVolumes }}
{{- fail (printf "operator.extraVolumes has a volume named %q, which the chart uses (%s): give it another name" .name (join ", " $chartVolumes)) }}
{{- end }}
{{- end }}
{{- $chartPaths := list "/etc/labkube" "/tmp" "/dev/shm" (trimSuffix "/" .Values.operator.runsRoot) }}
{{- range .Values.operator.extraVolumeMounts }}
{{- if has (trimSuffix "/" .mountPath) $chartPaths }}
{{- fail (printf "operator.extraVolumeMounts mounts %q at %s, where the chart mounts a volume of its own (%s): choose another mountPath" .name .mountPath (join ", " $chartPaths)) }}
{{- end }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if and $pdb.enabled (not (include "labkube.pdbBound" $pdb.minAvailable)) (not (include "labkube.pdbBound" $pdb.maxUnavailable)) }}
{{- fail "podDisruptionBudget.enabled is true but neither minAvailable nor maxUnavailable is set: set one (e.g. maxUnavailable: 1)" }}
{{- end }}
{{- end -}}

{{/*
A PodDisruptionBudget bound as JSON (`1`, `"50%"`), or nothing when unset (null or "").
*/}}
{{- define "labkube.pdbBound" -}}
{{- if and (not (kindIs "invalid" .)) (ne (toString .) "") -}}
{{- toJson . -}}
{{- end -}}
{{- end -}}

{{/*
The operator's permissions in a namespace with Campaigns and Runs. Role and ClusterRole both use
this block, so they cannot drift apart.
*/}}
{{- define "labkube.rules" -}}
- apiGroups:
  - labkube.dev
  resources:
  - campaigns
  - runs
  verbs:
  - create
  - delete
  - get
  - list
  - patch
  - update
  - watch
- apiGroups:
  - labkube.dev
  resources:
  - campaigns/status
  - runs/status
  verbs:
  - get
  - patch
  - update
- apiGroups:
  - labkube.dev
  resources:
  - campaigns/finalizers
  - runs/finalizers
  verbs:
  - update
- apiGroups:
  - ""
  resources:
  - pods
  verbs:
  - create
  - delete
  - get
  - list
  - patch
  - watch
- apiGroups:
  - ""
  resources:
  - events
  verbs:
  - create
- apiGroups:
  - ""
  resources:
  - configmaps
  verbs:
  - create
  - get
  - patch
{{- if .Values.networkPolicy.enabled }}
- apiGroups:
  - networking.k8s.io
  resources:
  - networkpolicies
  verbs:
  - create
  - get
  - patch
{{- end }}
{{- if and .Values.networkPolicy.enabled .Values.networkPolicy.cilium }}
- apiGroups:
  - cilium.io
  resources:
  - ciliumnetworkpolicies
  verbs:
  - create
  - get
  - patch
{{- end }}
{{- if include "labkube.claimPerRun" . }}
- apiGroups:
  - ""
  resources:
  - persistentvolumeclaims
  verbs:
  - create
  - delete
  - get
  - list
  - watch
{{- end }}
{{- end -}}

{{/*
What kopf needs cluster-wide to discover resources and namespaces.
*/}}
{{- define "labkube.discoveryRules" -}}
- apiGroups:
  - apiextensions.k8s.io
  resources:
  - customresourcedefinitions
  verbs:
  - list
  - watch
- apiGroups:
  - ""
  resources:
  - namespaces
  verbs:
  - list
  - watch
- apiGroups:
  - ""
  resources:
  - nodes
  verbs:
  - get
  - list
{{- end -}}

{{/*
Names of imagePullSecrets, as a JSON list.
*/}}
{{- define "labkube.pullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.imagePullSecrets -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}


{{/*
The run pods' NetworkPolicy, without a namespace: the operator puts it into every namespace with runs
before the first run pod (labkube.operator.cluster_api.ClusterApi.ensure_policies). Default deny in
both directions; egress to the cluster DNS and `networkPolicy.allowedCIDRs` only (the cloud metadata
addresses excepted from a /0); ingress to the metrics port from `networkPolicy.metricsFrom` only.
*/}}
{{- define "labkube.runNetworkPolicy" -}}
{{- $np := .Values.networkPolicy -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "labkube.fullname" . }}-runs
  labels:
    {{- include "labkube.runObjectLabels" . | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "labkube.runSelectorLabels" . | nindent 6 }}
  policyTypes:
    - Ingress
    - Egress
  ingress:
    {{- if $np.metricsFrom }}
    - from:
        {{- toYaml $np.metricsFrom | nindent 8 }}
      ports:
        - protocol: TCP
          port: {{ int .Values.runs.metricsPort }}
    {{- else }} []
    {{- end }}
  egress:
    - to:
        - namespaceSelector:
            matchLabels:
              kubernetes.io/metadata.name: {{ $np.dns.namespace }}
          podSelector:
            matchLabels:
              {{- toYaml $np.dns.podLabels | nindent 14 }}
      ports:
        - protocol: UDP
          port: 53
        - protocol: TCP
          port: 53
    {{- if $np.allowedCIDRs }}
    - to:
        {{- range $np.allowedCIDRs }}
        - ipBlock:
            cidr: {{ . }}
            {{- if eq . "0.0.0.0/0" }}
            except:
              - 169.254.0.0/16
            {{- else if eq . "::/0" }}
            except:
              - fe80::/10
              - fd00:ec2::254/128
            {{- end }}
        {{- end }}
      ports:
        {{- range $np.ports }}
        - protocol: TCP
          port: {{ int . }}
        {{- end }}
    {{- end }}
    {{- with $np.extraEgress }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/*
The Cilium variant for host names (toFQDNs), also put into every namespace with runs by the operator.
Policies are additive: run pods may reach what this or the NetworkPolicy allows.
*/}}
{{- define "labkube.runCiliumPolicy" -}}
{{- $np := .Values.networkPolicy -}}
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: {{ include "labkube.fullname" . }}-runs-fqdn
  labels:
    {{- include "labkube.runObjectLabels" . | nindent 4 }}
spec:
  endpointSelector:
    matchLabels:
      {{- include "labkube.runSelectorLabels" . | nindent 6 }}
  egress:
    - toEndpoints:
        - matchLabels:
            k8s:io.kubernetes.pod.namespace: {{ $np.dns.namespace }}
            {{- range $k, $v := $np.dns.podLabels }}
            k8s:{{ $k }}: {{ $v | quote }}
            {{- end }}
      toPorts:
        - ports:
            - port: "53"
              protocol: ANY
          rules:
            dns:
              - matchPattern: "*"
    {{- if $np.allowedHosts }}
    - toFQDNs:
        {{- range $np.allowedHosts }}
        {{- if hasPrefix "*" . }}
        - matchPattern: {{ . | quote }}
        {{- else }}
        - matchName: {{ . | quote }}
        {{- end }}
        {{- end }}
      toPorts:
        - ports:
            {{- range $np.ports }}
            - port: {{ int . | toString | quote }}
              protocol: TCP
            {{- end }}
    {{- end }}
{{- end -}}

{{/*
The chart's RayCluster (rayCluster.enabled): its name, and KubeRay's head Service in front of it.
*/}}
{{- define "labkube.rayClusterName" -}}
{{- printf "%s-ray" (include "labkube.fullname" .) | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "labkube.rayLabels" -}}
helm.sh/chart: {{ include "labkube.chart" . }}
app.kubernetes.io/name: {{ include "labkube.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: ray
app.kubernetes.io/part-of: labkube
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- include "labkube.commonLabels" . }}
{{- with .Values.rayCluster.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Scheduling of one Ray group, from (list .Values.rayCluster "head"|"workers"): the group's own nodeSelector,
tolerations and affinity, each defaulting to the one of rayCluster shared by both groups.
*/}}
{{- define "labkube.rayScheduling" -}}
{{- $ray := index . 0 -}}
{{- $group := index $ray (index . 1) -}}
{{- with default $ray.nodeSelector $group.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with default $ray.tolerations $group.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with default $ray.affinity $group.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The Ray cluster the operator drives through: the chart's RayCluster (Ray Client on KubeRay's head Service), else
operator.rayAddress; empty: Ray inside the operator pod. And the Secret with its auth token.
*/}}
{{- define "labkube.rayAddress" -}}
{{- if .Values.rayCluster.enabled -}}
{{- printf "ray://%s-head-svc.%s.svc:10001" (include "labkube.rayClusterName" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.operator.rayAddress -}}
{{- end -}}
{{- end -}}

{{- define "labkube.rayTokenSecret" -}}
{{- if .Values.rayCluster.enabled -}}
{{- include "labkube.rayClusterName" . -}}
{{- else -}}
{{- .Values.operator.rayAuthTokenSecret -}}
{{- end -}}
{{- end -}}
