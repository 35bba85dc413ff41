package integration

import vaultapi "github.com/hashicorp/vault/api"

func vaultapiMountInput() vaultapi.MountInput {
	return vaultapi.MountInput{Type: "kv", Options: map[string]string{"version": "1"}}
}
