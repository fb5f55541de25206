{{/* Scheduler <-> extender mutual TLS. Secret names and mount paths, and the chart-made certificates. */}}

{{- define "neuron.scheduler.serverSecret" -}}
{{ .Values.scheduler.tls.serverSecret | default "neuron-scheduler-extender-tls" }}
{{- end }}

{{- define "neuron.scheduler.clientSecret" -}}
{{ .Values.scheduler.tls.clientSecret | default (printf "%s-extender-client-tls" .Values.scheduler.name) }}
{{- end }}

{{/* Where my-scheduler finds its client certificate, key and the CA of the extender's certificate. */}}
{{- define "neuron.scheduler.clientDir" -}}
/etc/kubernetes/extender-client-tls
{{- end }}

{{/* Where the extender finds its server certificate, key and the CA of client certificates. */}}
{{- define "neuron.scheduler.serverDir" -}}
/etc/neuron-scheduler-extender/tls
{{- end }}

{{/* The annotations on the chart-made Secrets saying when their certificates were made and expire (seconds since
     the epoch; Helm templates cannot read a certificate's dates). */}}
{{- define "neuron.scheduler.notBeforeKey" -}}
neuron.amazonaws.com/tls-not-before
{{- end }}
{{- define "neuron.scheduler.notAfterKey" -}}
neuron.amazonaws.com/tls-not-after
{{- end }}

{{/* The chart-made certificates as YAML of base64 values (caCrt, serverCrt, serverKey, clientCrt, clientKey) and
     their validity (notBefore, notAfter: seconds since the epoch): those the chart's Secrets already hold (helm
     lookup, so an upgrade keeps them) while more than a third of their lifetime is left, else a new CA (genCA) and
     a server and a client certificate signed by it (genSignedCert). An upgrade thus renews an expired or nearly
     expired pair, and one whose Secret does not say when it expires (made by an older chart). Include it ONCE per
     render: every call without usable Secrets makes a new CA. */}}
{{- define "neuron.scheduler.tlsMaterial" -}}
{{- $s := .Values.scheduler -}}
{{- $ns := include "neuron.namespace" (dict "component" $s "root" .) -}}
{{- $serverObj := (lookup "v1" "Secret" $ns (include "neuron.scheduler.serverSecret" .)) | default dict -}}
{{- $server := $serverObj.data | default dict -}}
{{- $client := (lookup "v1" "Secret" $ns (include "neuron.scheduler.clientSecret" .)).data | default dict -}}
{{- $notes := (get ($serverObj.metadata | default dict) "annotations") | default dict -}}
{{- $nb := get $notes (include "neuron.scheduler.notBeforeKey" .) | default "0" | int64 -}}
{{- $na := get $notes (include "neuron.scheduler.notAfterKey" .) | default "0" | int64 -}}
{{- $now := now | unixEpoch | int64 -}}
{{- $fresh := and (gt $na $now) (gt (mul (sub $na $now) 3) (sub $na $nb)) -}}
{{- $kept := and $fresh (get $server "tls.crt") (get $server "tls.key") (get $server "ca.crt") (get $client "tls.crt")
               (get $client "tls.key") (eq (get $server "ca.crt") (get $client "ca.crt")) -}}
{{- if $kept -}}
caCrt: {{ get $server "ca.crt" }}
serverCrt: {{ get $server "tls.crt" }}
serverKey: {{ get $server "tls.key" }}
clientCrt: {{ get $client "tls.crt" }}
clientKey: {{ get $client "tls.key" }}
notBefore: {{ $nb | quote }}
notAfter: {{ $na | quote }}
{{- else -}}
{{- $days := int $s.tls.validityDays -}}
{{- $svc := printf "neuron-scheduler-extender.%s.svc" $ns -}}
{{- $ca := genCA "neuron-scheduler-extender-ca" $days -}}
{{- $names := list $svc (printf "%s.cluster.local" $svc) (printf "neuron-scheduler-extender.%s" $ns) "neuron-scheduler-extender" -}}
{{- $srv := genSignedCert $svc nil $names $days $ca -}}
{{- $cli := genSignedCert $s.name nil nil $days $ca -}}
caCrt: {{ $ca.Cert | b64enc }}
serverCrt: {{ $srv.Cert | b64enc }}
serverKey: {{ $srv.Key | b64enc }}
clientCrt: {{ $cli.Cert | b64enc }}
clientKey: {{ $cli.Key | b64enc }}
notBefore: {{ $now | quote }}
notAfter: {{ add $now (mul $days 86400) | quote }}
{{- end -}}
{{- end }}
