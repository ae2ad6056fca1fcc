{{/* The release's full name, at most 63 characters. */}}
{{- define "acp-worker.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "acp-worker.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: worker
{{- end -}}

{{- define "acp-worker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "acp-worker.serviceAccountName" -}}
{{- if .Values.serviceAccount.name -}}
{{- .Values.serviceAccount.name -}}
{{- else -}}
{{- include "acp-worker.fullname" . -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding ACPW_REDIS_URL (and ACPW_BROKER_URL), "" with the dev Redis. */}}
{{- define "acp-worker.redisSecret" -}}
{{- if .Values.redis.existingSecret -}}
{{- .Values.redis.existingSecret -}}
{{- else if .Values.redis.url -}}
{{- printf "%s-redis-url" (include "acp-worker.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "acp-worker.devRedisName" -}}
{{- printf "%s-dev-redis" (include "acp-worker.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The pool-wide backlog of this release: queued plus running jobs (PromQL). */}}
{{- define "acp-worker.backlogQuery" -}}
{{- $sel := printf "namespace=%q,service=%q" .Release.Namespace (printf "%s-metrics" (include "acp-worker.fullname" .)) -}}
{{- printf "max(acpw_queue_depth{%s}) + max(acpw_jobs_running{%s})" $sel $sel -}}
{{- end -}}

{{/* Seconds a SIGTERMed worker may need: the drain grace, then the hand-back (the agent's
cancel and shutdown graces, from env or the worker's defaults) and 5 s for Celery's exit. */}}
{{- define "acp-worker.drainNeeds" -}}
{{- $env := .Values.env -}}
{{- $cancel := index $env "ACPW_CANCEL_GRACE" | default "10" | float64 -}}
{{- $eof := index $env "ACPW_SHUTDOWN_EOF_GRACE" | default "3" | float64 -}}
{{- $term := index $env "ACPW_SHUTDOWN_TERM_GRACE" | default "2" | float64 -}}
{{- addf (float64 .Values.drain.graceSeconds) $cancel $eof $term 5 -}}
{{- end -}}

{{/* Refusals the schema cannot express, each with what to do instead. */}}
{{- define "acp-worker.checks" -}}
{{- if and (not .Values.redis.url) (not .Values.redis.existingSecret) (not .Values.devRedis.enabled) -}}
{{- fail "acp-worker: set redis.url, redis.existingSecret, or devRedis.enabled=true (trying it out only)" -}}
{{- end -}}
{{- if and .Values.devRedis.enabled (or .Values.redis.url .Values.redis.existingSecret) -}}
{{- fail "acp-worker: devRedis.enabled and redis.url/redis.existingSecret are exclusive: pick one Redis" -}}
{{- end -}}
{{- $need := include "acp-worker.drainNeeds" . | float64 -}}
{{- if lt (float64 .Values.drain.terminationGracePeriodSeconds) $need -}}
{{- fail (printf "acp-worker: drain.terminationGracePeriodSeconds (%v) must be at least %v: drain.graceSeconds + ACPW_CANCEL_GRACE + ACPW_SHUTDOWN_EOF_GRACE + ACPW_SHUTDOWN_TERM_GRACE + 5, the time to hand back what outlives the grace (docs/operating.md, Draining a worker)" .Values.drain.terminationGracePeriodSeconds $need) -}}
{{- end -}}
{{- if and .Values.autoscaling.keda.enabled .Values.autoscaling.hpa.enabled -}}
{{- fail "acp-worker: autoscaling.keda.enabled and autoscaling.hpa.enabled are exclusive (KEDA makes its own HPA)" -}}
{{- end -}}
{{- $images := .Values.sandbox.kubernetes.images -}}
{{- if and $images.pins $images.pinsConfigMap -}}
{{- fail "acp-worker: sandbox.kubernetes.images.pins and .pinsConfigMap are exclusive: give the pin files one way" -}}
{{- end -}}
{{- if and (or $images.pins $images.pinsConfigMap) (not $images.baseImageId) -}}
{{- fail "acp-worker: sandbox.kubernetes.images pins need .baseImageId (what `acp-worker image base` printed): the pins are found by it" -}}
{{- end -}}
{{- if eq .Values.sandbox.backend "kubernetes" -}}
{{- if not (and $images.baseImageId (or $images.pins $images.pinsConfigMap)) -}}
{{- fail "acp-worker: the kubernetes backend needs its pack images' pins, or no job can run (a worker pod has no container engine): set sandbox.kubernetes.images.baseImageId (what `acp-worker image base` prints) and .pins or .pinsConfigMap (the pins `acp-worker image build PACK` writes with ACPW_IMAGE_REGISTRY set; docs/helm.md, Pack images), or pick sandbox.backend docker/local for one node" -}}
{{- end -}}
{{- $k := .Values.sandbox.kubernetes -}}
{{- $enforced := and $k.createNamespace (eq $k.podSecurity.level "restricted") -}}
{{- if not (or $enforced $k.podSecurity.external) -}}
{{- fail (printf "acp-worker: the sandbox namespace %q must enforce Pod Security `restricted` (untrusted code runs there): keep sandbox.kubernetes.createNamespace=true with podSecurity.level=restricted, or label the namespace yourself (kubectl label ns %s pod-security.kubernetes.io/enforce=restricted) or enforce it with your own policy, and set sandbox.kubernetes.podSecurity.external=true" $k.namespace $k.namespace) -}}
{{- end -}}
{{- end -}}
{{- if eq .Values.sandbox.backend "kubernetes" -}}
{{- $state := include "acp-worker.gibibytes" .Values.stateVolume.sizeLimit | int -}}
{{- $copy := .Values.sandbox.kubernetes.copyOutMaxGi | int -}}
{{- if lt $state (add (mul 2 $copy) 2) -}}
{{- fail (printf "acp-worker: stateVolume.sizeLimit (%s) must hold twice sandbox.kubernetes.copyOutMaxGi (%d Gi: a copy-out's archive and the tree extracted from it) plus 2Gi for the pack cache, or a large copy-out gets the worker pod evicted with every job on it: raise stateVolume.sizeLimit to at least %dGi or lower copyOutMaxGi" .Values.stateVolume.sizeLimit $copy (add (mul 2 $copy) 2)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.sandbox.kubernetes.ownerReferences (ne .Release.Namespace .Values.sandbox.kubernetes.namespace) -}}
{{- fail (printf "acp-worker: sandbox.kubernetes.ownerReferences needs the release in the sandbox namespace %q (owner references cannot cross namespaces); it is in %q" .Values.sandbox.kubernetes.namespace .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{/* The ConfigMap of the pack images' pins (kubernetes backend); empty: none. */}}
{{- define "acp-worker.imagePins" -}}
{{- $images := .Values.sandbox.kubernetes.images -}}
{{- if $images.pinsConfigMap -}}
{{- $images.pinsConfigMap -}}
{{- else if $images.pins -}}
{{- printf "%s-image-pins" (include "acp-worker.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* ACPW_IMAGES_DIR of a worker given pins: read-only, apart from its state volume. */}}
{{- define "acp-worker.imagesDir" -}}
/etc/acp-worker/images
{{- end -}}

{{/* The labels of this release's worker pods (what the NetworkPolicies select them by). */}}
{{- define "acp-worker.workerPodLabels" -}}
{{- include "acp-worker.selectorLabels" . }}
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The proxy peer of acpw-sandbox-proxy-only, as YAML {podLabels, namespaceLabels}: the
operator's, or this release's workers (selector labels; the release namespace by its
kubernetes.io/metadata.name label, which the API server sets on every namespace, unless it
is the sandbox namespace). */}}
{{- define "acp-worker.proxyPeer" -}}
{{- $proxy := .Values.sandbox.kubernetes.networkPolicies.proxy -}}
{{- if $proxy.podLabels -}}
podLabels: {{ toJson $proxy.podLabels }}
namespaceLabels: {{ toJson ($proxy.namespaceLabels | default dict) }}
{{- else -}}
podLabels: {{ include "acp-worker.selectorLabels" . | fromYaml | toJson }}
{{- if ne .Release.Namespace .Values.sandbox.kubernetes.namespace }}
namespaceLabels: {{ dict "kubernetes.io/metadata.name" .Release.Namespace | toJson }}
{{- else }}
namespaceLabels: {}
{{- end }}
{{- end -}}
{{- end -}}

{{/* A quantity in Mi, Gi or Ti as whole GiB (rounded down); another unit fails. */}}
{{- define "acp-worker.gibibytes" -}}
{{- $q := toString . -}}
{{- if hasSuffix "Ti" $q -}}{{ mul (trimSuffix "Ti" $q | int) 1024 }}
{{- else if hasSuffix "Gi" $q -}}{{ trimSuffix "Gi" $q | int }}
{{- else if hasSuffix "Mi" $q -}}{{ div (trimSuffix "Mi" $q | int) 1024 }}
{{- else -}}{{ fail (printf "acp-worker: stateVolume.sizeLimit %q: give it in Mi, Gi or Ti" $q) }}
{{- end -}}
{{- end -}}
