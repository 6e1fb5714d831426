import pulumi
