{{/* The chart's name, and the name of its objects (the release name if it already holds the chart's). */}}
{{- define "kde.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kde.fullname" -}}
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

{{/* Selects the release's pods; app.kubernetes.io/name also gives the monitors' job label. */}}
{{- define "kde.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kde.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kde.labels" -}}
{{ include "kde.selectorLabels" . }}
app.kubernetes.io/part-of: kube-device-exporter
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "kde.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* The web config file inside the container. */}}
{{- define "kde.webConfigDir" -}}/etc/kube-device-exporter/web{{- end }}

{{/* One scrape endpoint, shared by the ServiceMonitor and the PodMonitor. */}}
{{- define "kde.endpoint" -}}
{{- $values := index . 0 }}
{{- $root := index . 1 }}
- port: metrics
  path: /metrics
  interval: {{ $values.interval }}
  scrapeTimeout: {{ $values.scrapeTimeout }}
  {{- /* dcgm schema: the holder's pod/namespace/container must win over the target's */}}
  honorLabels: {{ contains "dcgm" $root.Values.metricsSchema }}
  relabelings:
    - sourceLabels: [__meta_kubernetes_pod_node_name]
      targetLabel: node
      action: replace
    {{- with $values.relabelings }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $values.metricRelabelings }}
  metricRelabelings:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if and $root.Values.webConfig.secretName $root.Values.webConfig.tls }}
  scheme: https
  tlsConfig:
    ca:
      secret:
        name: {{ $root.Values.webConfig.secretName }}
        key: {{ $root.Values.webConfig.caKey }}
    serverName: {{ default (printf "%s.%s.svc" (include "kde.fullname" $root) $root.Release.Namespace) $root.Values.webConfig.serverName }}
  {{- end }}
{{- end }}
